"""OSS and S3 through the S3 API (boto3): `oss://bucket/path` and `s3://bucket/path`.

Objects are files; a "directory" is a key prefix ending in "/". OSS speaks the S3 API
at its S3-compatible endpoints (``https://s3.oss-<region>.aliyuncs.com``), with
virtual-hosted bucket addressing only; the region is taken from such a host name.
Credentials are the config's `oss_access_id`/`oss_access_key` when given, else boto3's
standard chain (AWS_* environment variables, ~/.aws, instance roles).

Every boto3/botocore error is translated here, once: a missing object or prefix is
"absent" (None / []), anything else (unreachable endpoint, denied access, a throttled
request after botocore's own retries) is `StorageError` naming the URL but never the
credentials.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]

from recserve.errors import StorageError

__all__ = ["ObjectStorage", "oss_region", "split_url"]

SCHEMES = ("oss", "s3")
_ALIYUN_HOST = re.compile(r"^(?:s3\.)?oss-([a-z0-9-]+?)(?:-internal)?\.aliyuncs\.com$")
_ABSENT_CODES = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}


def split_url(url: str) -> tuple[str, str]:
    """`oss://bucket/a/b` -> ("bucket", "a/b"); StorageError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise StorageError(f"{url!r} is not an object store URL; expected oss://bucket/path or s3://bucket/path")
    return parts.netloc, parts.path.lstrip("/")


def oss_region(endpoint: str) -> str | None:
    """The region of an OSS endpoint host ("s3.oss-cn-hangzhou.aliyuncs.com" -> "cn-hangzhou")."""
    host = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}").hostname or ""
    match = _ALIYUN_HOST.match(host)
    return match.group(1) if match else None


class ObjectStorage:
    """`Storage` over an S3-API object store. Thread-safe: boto3 clients are (a client is
    created once and shared; each call is one or a few independent HTTP requests)."""

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        access_id: str | None = None,
        access_key: str | None = None,
        region: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
    ) -> None:
        url = endpoint if endpoint is None or "://" in endpoint else f"https://{endpoint}"
        aliyun_region = oss_region(url) if url else None
        config = botocore.config.Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": 3, "mode": "standard"},
            # OSS serves virtual-hosted buckets only; elsewhere let botocore choose.
            s3={"addressing_style": "virtual" if aliyun_region else "auto"},
            # Newer botocore adds CRC checksums by default, which S3-compatible stores
            # (OSS among them) do not all accept; only send/check them where required.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._endpoint = url
        try:
            self._client: Any = boto3.session.Session().client(
                "s3",
                endpoint_url=url,
                aws_access_key_id=access_id,
                aws_secret_access_key=access_key,
                region_name=region or aliyun_region or None,
                config=config,
            )
        except (botocore.exceptions.BotoCoreError, ValueError) as exc:
            raise StorageError(f"cannot create an S3 client for endpoint {url or '(AWS default)'}: {exc}") from exc

    def _fail(self, action: str, url: str, exc: Exception) -> StorageError:
        where = f" at {self._endpoint}" if self._endpoint else ""
        if isinstance(exc, botocore.exceptions.ClientError):
            err = exc.response.get("Error", {})
            detail = f"{err.get('Code', '?')}: {err.get('Message', '')}".rstrip(": ")
        else:
            detail = f"{type(exc).__name__}: {exc}"
        return StorageError(f"cannot {action} {url}{where}: {detail}")

    @staticmethod
    def _absent(exc: Exception) -> bool:
        if not isinstance(exc, botocore.exceptions.ClientError):
            return False
        return str(exc.response.get("Error", {}).get("Code")) in _ABSENT_CODES

    def _list(self, url: str, *, limit: int | None = None) -> tuple[list[str], list[str]]:
        """(child dir names, child file names) under the prefix `url`/."""
        bucket, key = split_url(url)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        dirs: list[str] = []
        files: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
        if limit is not None:
            kwargs["MaxKeys"] = limit
        try:
            while True:
                page = self._client.list_objects_v2(**kwargs)
                dirs += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
                # A key equal to the prefix is a "directory marker" some tools write.
                files += [o["Key"][len(prefix):] for o in page.get("Contents", []) if o["Key"] != prefix]
                if limit is not None or not page.get("IsTruncated"):
                    return dirs, files
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
        except Exception as exc:  # botocore raises ClientError, EndpointConnectionError, ...
            if self._absent(exc):
                return [], []
            raise self._fail("list", url, exc) from exc

    def files_under(self, path: str) -> dict[str, tuple[int, str]]:
        """Every object below `path`: relative key -> (size, ETag), in one paginated listing.

        Lets a poller see a whole checkpoint dir in one request instead of one or more per
        version and delta (`watcher.TreeSnapshot`)."""
        bucket, key = split_url(path)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        out: dict[str, tuple[int, str]] = {}
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        try:
            while True:
                page = self._client.list_objects_v2(**kwargs)
                for o in page.get("Contents", []):
                    if not o["Key"].endswith("/"):
                        out[o["Key"][len(prefix):]] = (int(o["Size"]), str(o.get("ETag", "")))
                if not page.get("IsTruncated"):
                    return out
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
        except Exception as exc:  # botocore raises ClientError, EndpointConnectionError, ...
            if self._absent(exc):
                return {}
            raise self._fail("list", path, exc) from exc

    def list(self, path: str) -> list[str]:
        dirs, files = self._list(path)
        return sorted(set(dirs) | set(files))

    def is_dir(self, path: str) -> bool:
        bucket, key = split_url(path)
        if not key.strip("/"):
            return True  # the bucket root
        dirs, files = self._list(path, limit=1)
        if dirs or files:
            return True
        # An empty "directory" exists only as a marker object "key/".
        return self._head((bucket, key.rstrip("/") + "/"), path) is not None

    def _head(self, target: tuple[str, str], url: str) -> dict[str, Any] | None:
        try:
            return self._client.head_object(Bucket=target[0], Key=target[1])  # type: ignore[no-any-return]
        except Exception as exc:
            if self._absent(exc):
                return None
            raise self._fail("stat", url, exc) from exc

    def size(self, path: str) -> int | None:
        bucket, key = split_url(path)
        if not key or key.endswith("/"):
            return None
        head = self._head((bucket, key), path)
        return None if head is None else int(head["ContentLength"])

    def _get(self, path: str, byte_range: str | None) -> bytes:
        bucket, key = split_url(path)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if byte_range is not None:
            kwargs["Range"] = byte_range
        try:
            return self._client.get_object(**kwargs)["Body"].read()  # type: ignore[no-any-return]
        except Exception as exc:
            # Only a ClientError carries an S3 error code; a body cut short raises
            # botocore's ResponseStreamingError, whose `response` is None.
            code = exc.response.get("Error", {}).get("Code") if isinstance(exc, botocore.exceptions.ClientError) else None
            if byte_range is not None and code == "InvalidRange":
                return b""  # the range starts at or past the end of the object
            if self._absent(exc):
                raise StorageError(f"cannot read {path}: no such object") from exc
            raise self._fail("read", path, exc) from exc

    def read(self, path: str) -> bytes:
        return self._get(path, None)

    def read_range(self, path: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return self._get(path, f"bytes={start}-{start + length - 1}")

    def local_path(self, path: str) -> str | None:
        return None
