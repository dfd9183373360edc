"""The `s3` artifact store: any S3-compatible server (AWS S3, SeaweedFS, Ceph RGW, MinIO).

SME2_ARTIFACT_STORE=s3://BUCKET/PREFIX, SME2_S3_ENDPOINT_URL for a server that is not AWS, and the
credentials from boto3's standard chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE,
~/.aws/config and credentials, instance roles). boto3 is imported only by a farm configured so.

An object is written whole by one PUT (or a multipart upload completed at once): no reader sees
half of one. Each carries its sha256 in its metadata, which is how a content-addressed object
already in the bucket is trusted. Every failure to reach the server, and every 5xx or throttle
answer, is StoreUnavailable (503 with Retry-After at the API, a later retry at ingest).
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator
from urllib.parse import urlparse

from sme2farm.server.store.base import ArtifactStore, StoreUnavailable, sha256_of

# A request's own bounds: an outage is answered in seconds, not after the OS's TCP timeouts.
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 30.0
MULTIPART_FROM = 64 << 20


def parse_url(url: str) -> tuple[str, str]:
    """s3://BUCKET/PREFIX -> (bucket, prefix with a trailing slash or '')."""
    u = urlparse(url)
    if u.scheme != "s3" or not u.netloc:
        raise ValueError(f"SME2_ARTIFACT_STORE={url!r}: expected 'file' or s3://BUCKET/PREFIX")
    prefix = u.path.strip("/")
    return u.netloc, f"{prefix}/" if prefix else ""


class _Body:
    """A GET's body as a closable binary stream."""

    def __init__(self, body, on_error):
        self._body, self._on_error = body, on_error

    def read(self, n: int = -1) -> bytes:
        try:
            return self._body.read(None if n is None or n < 0 else n)
        except Exception as e:  # a connection dropped mid-body
            raise self._on_error(e) from e

    def close(self) -> None:
        self._body.close()

    def __enter__(self) -> "_Body":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class S3Store(ArtifactStore):
    kind = "s3"

    def __init__(self, url: str, *, spool: Path, endpoint_url: str | None = None, min_free_bytes: int = 0):
        super().__init__(spool, min_free_bytes=min_free_bytes)
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.url = url
        self.bucket, self.prefix = parse_url(url)
        self.endpoint_url = endpoint_url
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region,
            config=Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                          retries={"mode": "standard", "max_attempts": 2},
                          s3={"addressing_style": "path"} if endpoint_url else None))
        self.transfer = TransferConfig(multipart_threshold=MULTIPART_FROM, multipart_chunksize=MULTIPART_FROM,
                                       max_concurrency=4)
        self.requests = 0  # what this process asked the server (bench/scale.py counts them per run)

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _unavailable(self, e: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"the artifact store {self.url} is unavailable: {type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200] if str(e) else ''}")

    def _call(self, what: str, **kw):
        from botocore.exceptions import BotoCoreError, ClientError
        self.requests += 1
        try:
            return getattr(self.client, what)(Bucket=self.bucket, **kw)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(kw.get("Key", what)) from None
            if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "RequestTimeout", "InternalError"):
                raise self._unavailable(e) from e
            raise
        except BotoCoreError as e:  # refused, reset, timed out, DNS
            raise self._unavailable(e) from e

    def keep(self, tmp: Path, key: str, *, sha256: str | None = None) -> None:
        try:
            size = tmp.stat().st_size
            if sha256 is not None:
                head = self._head(key)
                if head is not None and head[0] == size and head[1] == sha256:
                    return
            if sha256 is None:
                with open(tmp, "rb") as f:
                    size, sha256 = sha256_of(f)
            self._upload(tmp, key, sha256, size)
        finally:
            tmp.unlink(missing_ok=True)

    def _upload(self, path: Path, key: str, sha256: str, size: int) -> None:
        """One PUT streamed from the file below MULTIPART_FROM (botocore rewinds it to retry):
        upload_file would start a transfer manager, its threads and futures, for a single request
        (2.4 ms of CPU against 1.4 for a 20 KB trace on SeaweedFS, on the server for every delivery).
        Either way, whatever stops the upload is the store unable to keep it now."""
        self.requests += 1
        try:
            if size < MULTIPART_FROM:
                with open(path, "rb") as body:
                    self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body,
                                           Metadata={"sha256": sha256})
            else:
                self.client.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer,
                                        ExtraArgs={"Metadata": {"sha256": sha256}})
        except Exception as e:  # botocore's errors, and boto3's transfer wrapping what it met (S3UploadFailedError)
            raise self._unavailable(e) from e

    def _head(self, key: str) -> tuple[int, str] | None:
        try:
            r = self._call("head_object", Key=self._key(key))
        except FileNotFoundError:
            return None
        return r["ContentLength"], r.get("Metadata", {}).get("sha256", "")

    def put(self, key: str, data: bytes) -> tuple[int, str]:
        sha = hashlib.sha256(data).hexdigest()
        self._call("put_object", Key=self._key(key), Body=data, Metadata={"sha256": sha})
        return len(data), sha

    def digest(self, key: str) -> str | None:
        """The sha256 the object was written with (its metadata, one HEAD); one written without it
        is hashed from its bytes."""
        head = self._head(key)
        if head is None:
            return None
        return head[1] or super().digest(key)

    def size(self, key: str) -> int | None:
        head = self._head(key)
        return None if head is None else head[0]

    def open(self, key: str) -> BinaryIO:
        r = self._call("get_object", Key=self._key(key))
        return _Body(r["Body"], self._unavailable)  # type: ignore[return-value]

    def open_sized(self, key: str) -> tuple[BinaryIO, int]:
        """The body and its length from one GET (a download answers with its Content-Length)."""
        r = self._call("get_object", Key=self._key(key))
        return _Body(r["Body"], self._unavailable), r["ContentLength"]  # type: ignore[return-value]

    def read_bytes(self, key: str, limit: int | None = None) -> bytes:
        if limit is None:
            with self.open(key) as f:
                return f.read()
        try:
            r = self._call("get_object", Key=self._key(key), Range=f"bytes=0-{max(limit - 1, 0)}")
        except Exception as e:
            from botocore.exceptions import ClientError
            if isinstance(e, ClientError) and e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                return b""  # an empty object has no first byte to range over
            raise
        with _Body(r["Body"], self._unavailable) as f:
            return f.read()

    @contextmanager
    def local(self, key: str) -> Iterator[Path]:
        fd, path = self.temp_file(".download")
        try:
            with os.fdopen(fd, "wb") as out, self.open(key) as body:
                while chunk := body.read(1 << 20):
                    out.write(chunk)
            yield path
        finally:
            path.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        self._call("delete_object", Key=self._key(key))

    def keys(self, prefix: str) -> Iterator[str]:
        token = None
        while True:
            kw = {"Prefix": self._key(prefix)}
            if token:
                kw["ContinuationToken"] = token
            r = self._call("list_objects_v2", **kw)
            for item in r.get("Contents", []):
                yield item["Key"][len(self.prefix):]
            if not r.get("IsTruncated"):
                return
            token = r.get("NextContinuationToken")

    def ensure_bucket(self) -> None:
        """Create the bucket if it is not there (a farm's first start on a fresh server)."""
        from botocore.exceptions import ClientError
        try:
            self._call("head_bucket")
        except (ClientError, FileNotFoundError):
            self._call("create_bucket")

    def state(self) -> dict:
        try:
            self._call("head_bucket")
        except Exception as e:
            detail = str(e) if isinstance(e, StoreUnavailable) else f"{type(e).__name__}: {str(e)[:200]}"
            return {"store": self.kind, "ok": False, "bucket": self.bucket, "detail": detail}
        return {"store": self.kind, "ok": True, "bucket": self.bucket}

