"""`sme2-farm store copy`: a `file` farm's artifacts copied into the configured S3 store
(SME2_ARTIFACT_STORE=s3://..., SME2_S3_ENDPOINT_URL, the AWS variables), for moving a farm, running
or not, onto a bucket. Idempotent: an object already in the bucket with the same sha256 is left as
it is; every copied object's digest is checked against the bucket's afterwards. A content-addressed
source file whose bytes do not hash to its name is reported and not copied. Run it again after the
farm is switched over to take what arrived in between."""

from __future__ import annotations

import shutil
from pathlib import Path

from sme2farm.farm.preflight import settings_for
from sme2farm.server.store.base import SHA256, sha256_of
from sme2farm.server.store.file import FileStore

# What a file farm keeps (store/base.py keys), its temp files and database excluded.
PREFIXES = ("models/", "inputs/", "etrecords/", "artifacts/", "reports/")


def cmd_store(args) -> int:
    settings = settings_for(args.data_dir)
    source_dir = Path(args.source) if args.source else settings.data_dir
    if settings.artifact_store == "file":
        raise SystemExit("sme2-farm store copy: SME2_ARTIFACT_STORE is `file`; set it to the bucket, "
                         "s3://BUCKET/PREFIX (and SME2_S3_ENDPOINT_URL for a server that is not AWS)")
    from sme2farm.server.store.s3 import S3Store
    dest = S3Store(settings.artifact_store, spool=source_dir / "tmp", endpoint_url=settings.s3_endpoint_url)
    dest.ensure_bucket()
    source = FileStore(source_dir)
    copied = present = refused = 0
    for prefix in PREFIXES:
        for key in sorted(source.keys(prefix)):
            if key.endswith(".tmp"):
                continue
            with source.open(key) as f:
                size, sha = sha256_of(f)
            named = Path(key).stem if prefix in ("models/", "inputs/", "etrecords/") else None
            if named is not None and SHA256.match(named) and named != sha:
                print(f"refused {key}: its bytes hash to {sha}, not its name (a damaged file; not copied)")
                refused += 1
                continue
            if dest.digest(key) == sha:
                present += 1
                continue
            fd, tmp = dest.temp_file(".copy")
            with open(fd, "wb", closefd=True) as out, source.open(key) as f:
                shutil.copyfileobj(f, out, 1 << 20)
            dest.keep(tmp, key, sha256=sha)
            if dest.digest(key) != sha:
                print(f"refused {key}: the bucket's copy does not have its sha256 {sha}")
                refused += 1
                continue
            copied += 1
    print(f"{copied} copied, {present} already in {settings.artifact_store}, {refused} refused")
    return 1 if refused else 0
