#!/usr/bin/python3
"""loadgen.py - the load generator's old path: runs canopy_loadgen (the
module `pip install ./clients` installs as the `canopy-loadgen` command)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from canopy_loadgen import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
