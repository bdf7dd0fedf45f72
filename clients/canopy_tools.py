"""canopy_tools - the console commands of `pip install ./clients`
(clients/pyproject.toml): canopy-import, canopy-client, canopy-loadgen.

Each runs in whatever Python it was installed into. A package that
Python lacks is named with how to get it, instead of a traceback ending
in ModuleNotFoundError: canopy-import needs PyTorch (the canopy_torch
package is built on it); the client and the load generator need only the
standard library.
"""
import sys

# what each command imports beyond the standard library: (module, how to
# install it)
NEEDS = {
    "canopy-import": [("torch", "Debian's python3-torch (apt-get install "
                       "python3-torch; a venv made with "
                       "--system-site-packages sees it), or pip install "
                       "torch")],
}


def need(cmd):
    """Exit 2 with a message naming each missing package of cmd."""
    for mod, how in NEEDS.get(cmd, ()):
        try:
            __import__(mod)
        except ImportError as e:
            sys.stderr.write(
                f"{cmd}: needs the Python package '{mod}', which this "
                f"Python ({sys.executable}) cannot import ({e}).\n"
                f"  Install it: {how};\n"
                f"  or run {cmd} from a Python that has it.\n")
            sys.exit(2)


def canopy_import():
    need("canopy-import")
    from canopy_torch.importer import main
    sys.exit(main())


def canopy_client():
    need("canopy-client")
    from canopy_client import main
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)


def canopy_loadgen():
    need("canopy-loadgen")
    from canopy_loadgen import main
    sys.exit(main())
