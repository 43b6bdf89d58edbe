"""python -m aotc.completeness CONFIG [--store URL]: is every entry of a matrix published?

The last step of a sharded build (configs/k8s/build-job.yaml, configs/ci/github-actions.yaml): each
shard publishes what it built, content addressing merges them, and this confirms the union. An entry
counts as published when the store holds a manifest for the fingerprint computed here, so run it in
the builders' image and environment. Exit 0 complete, 3 something missing (DESIGN.md exit codes).
"""

from __future__ import annotations

import argparse
import json
import sys

from aotc.errors import EXIT_NOT_FOUND, AotcError


def missing_entries(config: str, store_url: str | None) -> tuple[str, list[dict]]:
    from aotc.fingerprint import fingerprint_entry
    from aotc.matrix import load_matrix
    from aotc.store import Store, resolve_store_url

    matrix = load_matrix(config)
    store = Store.from_url(resolve_store_url(store_url, matrix.store))
    rows = []
    for entry in matrix.entries:
        digest = fingerprint_entry(entry).digest
        rows.append({"entry": entry.name, "fingerprint": digest,
                     "published": store.fs.exists(store.manifest_path(entry.name, digest))})
    return store.url, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aotc.completeness", description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--store", metavar="URL")
    args = parser.parse_args(argv)
    try:
        url, rows = missing_entries(args.config, args.store)
    except AotcError as exc:
        print(f"aotc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    missing = [r for r in rows if not r["published"]]
    for row in missing:
        print(f"aotc: not published: {row['entry']} {row['fingerprint'][:16]} in {url}", file=sys.stderr)
    print(f"aotc: {len(rows) - len(missing)}/{len(rows)} entries of {args.config} published in {url}",
          file=sys.stderr)
    json.dump({"store": url, "config": args.config, "complete": not missing, "entries": rows}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return EXIT_NOT_FOUND if missing else 0


if __name__ == "__main__":
    sys.exit(main())
