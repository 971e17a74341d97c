"""Decode many capture files in parallel on Spark: one task per file, same dataset as ``kwire decode``.

    spark-submit spark_jobs/decode_job.py hdfs:///captures/ -o hdfs:///kwire/dataset
    python -m spark_jobs.decode_job captures/*.pcap -o out/all.kwire [--master local[2]]

Inputs are files or folders on any filesystem pyarrow reaches (local paths, ``file://``,
``hdfs://``, ``s3://``, ``gs://``); folders contribute their ``.pcap``, ``.pcapng``,
``.cap`` and ``.gz`` files. Each task copies its capture to local disk when it is remote,
decodes it with the same code as ``kwire decode`` (``kwire.decode_command.decode_captures``:
same rows, ``source`` = the file name), writes Parquet locally and copies the files into the
output dataset (``exchanges/date=.../`` and ``connections/date=.../``). A damaged capture
keeps its rows and is reported; it does not fail the job.

Executors need kwire importable (``pip install`` it on the cluster's Python, or ship it with
``--py-files``).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # spark-submit runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["decode_file_task", "expand_inputs", "run_decode"]

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".gz")


def _filesystem(uri: str) -> tuple[Any, str]:
    from pyarrow import fs

    if "://" not in uri:
        return fs.LocalFileSystem(), os.path.abspath(uri)
    return fs.FileSystem.from_uri(uri)


def expand_inputs(inputs: list[str]) -> list[str]:
    """Files named, files in folders named, and local globs, sorted and deduplicated. Local paths
    come back absolute: executors run in their own working folders (a standalone worker's)."""
    from pyarrow import fs

    out: list[str] = []
    for item in inputs:
        local_matches = glob.glob(item) if "://" not in item and glob.has_magic(item) else []
        for candidate in local_matches or [item]:
            filesystem, path = _filesystem(candidate)
            info = filesystem.get_file_info(path)
            if info.type == fs.FileType.Directory:
                scheme = candidate.split("://", 1)[0] + "://" if "://" in candidate else ""
                for entry in filesystem.get_file_info(fs.FileSelector(path, recursive=True)):
                    if entry.type == fs.FileType.File and entry.path.endswith(CAPTURE_SUFFIXES):
                        out.append(scheme + entry.path if scheme else entry.path)
            elif info.type == fs.FileType.File:
                out.append(candidate if "://" in candidate else path)
            else:
                raise FileNotFoundError(f"no such capture file or folder: {candidate}")
    return sorted(set(out))


def decode_file_task(uri: str, out_uri: str) -> dict[str, Any]:
    """Decode one capture into the dataset at ``out_uri``; return what it counted (runs on an executor)."""
    from pyarrow import fs

    from kwire.decode_command import decode_captures, decode_writer
    from kwire.runtime import tune_gc

    tune_gc()
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    with tempfile.TemporaryDirectory(prefix="kwire-decode-") as scratch:
        filesystem, path = _filesystem(uri)
        if isinstance(filesystem, fs.LocalFileSystem):
            local = path
        else:
            local = os.path.join(scratch, name)
            fs.copy_files(
                path, local, source_filesystem=filesystem, destination_filesystem=fs.LocalFileSystem()
            )
        staging = Path(scratch) / "dataset"
        writer = decode_writer(staging, prefix=f"part-{Path(name).stem}-{uuid.uuid4().hex[:8]}")
        try:
            result = decode_captures([local], writer.exchanges.append, writer.connections.append)
        finally:
            writer.close()
        out_fs, out_path = _filesystem(out_uri)
        for file in staging.rglob("*.parquet"):
            relative = file.relative_to(staging).as_posix()
            out_fs.create_dir(f"{out_path}/{relative.rsplit('/', 1)[0]}", recursive=True)
            fs.copy_files(
                str(file),
                f"{out_path}/{relative}",
                source_filesystem=fs.LocalFileSystem(),
                destination_filesystem=out_fs,
            )
    # The source column is the file name, as for `kwire decode FILE`; say so if the name is not unique.
    return {
        "file": uri,
        "exchanges": result.summary.exchanges,
        "packets": result.capture.packets,
        "error": str(result.error) if result.error else None,
    }


def run_decode(spark: Any, inputs: list[str], out_uri: str) -> list[dict[str, Any]]:
    """Decode every capture under ``inputs`` into ``out_uri``, one Spark task per file."""
    files = expand_inputs(inputs)
    if not files:
        return []
    names = [f.rstrip("/").rsplit("/", 1)[-1] for f in files]
    if len(set(names)) != len(names):
        raise ValueError("capture file names must be unique: the source column holds the file name")
    if "://" not in out_uri:  # resolved here, not in an executor's working folder
        out_uri = os.path.abspath(out_uri)
    rdd = spark.sparkContext.parallelize(files, numSlices=len(files))
    return rdd.map(lambda uri: decode_file_task(uri, out_uri)).collect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Decode capture files on Spark into a kwire dataset.")
    parser.add_argument("inputs", nargs="+", help="capture files or folders (any pyarrow filesystem URI)")
    parser.add_argument("-o", "--out", required=True, help="output dataset (created; must not exist)")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    args = parser.parse_args(argv)
    out_fs, out_path = _filesystem(args.out)
    from pyarrow import fs

    if out_fs.get_file_info(out_path).type != fs.FileType.NotFound:
        print(f"decode_job: {args.out} exists", file=sys.stderr)
        return 2
    try:
        files = expand_inputs(args.inputs)
    except FileNotFoundError as exc:
        print(f"decode_job: {exc}", file=sys.stderr)
        return 2
    from spark_jobs.session import build_session

    spark = build_session(args.master, "kwire-decode")
    try:
        results = run_decode(spark, files, args.out)
    except ValueError as exc:
        print(f"decode_job: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    damaged = [r for r in results if r["error"]]
    print(
        f"decoded {len(results)} captures: {sum(r['exchanges'] for r in results):,} exchanges, "
        f"{sum(r['packets'] for r in results):,} packets -> {args.out}"
    )
    for r in damaged:
        print(f"  damaged: {r['error']}", file=sys.stderr)
    return 2 if damaged else 0


if __name__ == "__main__":
    raise SystemExit(main())
