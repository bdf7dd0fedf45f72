#!/usr/bin/python3
"""validate_kserve_runtime.py - checks deploy/kserve/servingruntime.yaml
and servingruntime-grpc.yaml (or the files given) against the
openAPIV3Schema of KServe's own CustomResourceDefinition, as the Kubernetes API server would on `kubectl
apply`: the schema of the version the document's apiVersion names, and
no field the API server would prune as unknown (a structural schema keeps
only the fields it declares, so a misspelt field would vanish silently).

Opt-in, not part of `meson test`: the CRD is KServe's, not this
repository's. Get it from a KServe release (the file
serving.kserve.io_servingruntimes.yaml of its CRDs, e.g. under
config/crd/full/ in KServe's source) and give its path:

  scripts/validate_kserve_runtime.py PATH/serving.kserve.io_servingruntimes.yaml
  scripts/validate_kserve_runtime.py CRD.yaml RUNTIME.yaml [RUNTIME.yaml ...]

Needs Debian's python3-yaml and python3-jsonschema. Exit 0: every
document valid; 1: errors, each with the path of the field; 2: usage.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = [os.path.normpath(os.path.join(HERE, "..", "deploy", "kserve", f))
           for f in ("servingruntime.yaml", "servingruntime-grpc.yaml")]


def pruned(doc, schema, path="", out=None):
    """Fields of doc the API server would drop: keys of an object whose
    schema lists properties, allows no additionalProperties and does not
    preserve unknown fields."""
    out = [] if out is None else out
    if not isinstance(schema, dict):
        return out
    if isinstance(doc, dict):
        props = schema.get("properties")
        keep = (schema.get("x-kubernetes-preserve-unknown-fields")
                or schema.get("additionalProperties") not in (None, False))
        for k, v in doc.items():
            if props is not None and k in props:
                pruned(v, props[k], f"{path}.{k}", out)
            elif props is not None and not keep:
                out.append(f"{path}.{k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                pruned(v, schema["additionalProperties"], f"{path}.{k}", out)
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(doc):
            pruned(v, schema["items"], f"{path}[{i}]", out)
    return out


def crd_schemas(path, yaml):
    """{(group/version, kind): openAPIV3Schema} of the CRD file(s)."""
    out = {}
    with open(path) as f:
        for d in yaml.safe_load_all(f):
            if not d or d.get("kind") != "CustomResourceDefinition":
                continue
            spec = d["spec"]
            for v in spec["versions"]:
                s = v.get("schema", {}).get("openAPIV3Schema")
                if s is not None:
                    out[(f"{spec['group']}/{v['name']}",
                         spec["names"]["kind"])] = s
    return out


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) > 1 else 2
    try:
        import yaml
        import jsonschema
    except ImportError as e:
        print(f"validate_kserve_runtime: {e}: install Debian's python3-yaml "
              "and python3-jsonschema", file=sys.stderr)
        return 2
    schemas = crd_schemas(argv[1], yaml)
    if not schemas:
        print(f"{argv[1]}: no CustomResourceDefinition with an "
              "openAPIV3Schema", file=sys.stderr)
        return 2
    bad = 0
    for path in argv[2:] or DEFAULT:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            key = (d.get("apiVersion"), d.get("kind"))
            name = f"{path}: {key[1]} {d.get('metadata', {}).get('name')}"
            if key not in schemas:
                print(f"{name}: the CRD defines no {key[1]} "
                      f"{key[0]} (it has: {sorted(schemas)})")
                bad += 1
                continue
            schema = schemas[key]
            errs = sorted(jsonschema.Draft7Validator(schema).iter_errors(d),
                          key=lambda e: list(e.absolute_path))
            for e in errs:
                where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                                for p in e.absolute_path)
                print(f"{name}: {where or '.'}: {e.message}")
            drop = pruned(d, schema)
            for p in drop:
                print(f"{name}: {p}: not in the schema (the API server "
                      "would prune it)")
            bad += len(errs) + len(drop)
            if not errs and not drop:
                print(f"{name}: valid against {os.path.basename(argv[1])} "
                      f"({key[0]})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
