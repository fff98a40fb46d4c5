"""Time `specpair download` (transfer + sha256 verification + lockfile) against plain `hf_hub_download`.

A local fake Hub (tests/hubserver.py, on 127.0.0.1) serves a repo of generated LFS files (a few hundred MB
of random bytes, so nothing compresses). In the same run and against the same server, each tool downloads
all of it into a fresh HF cache, in a fresh process: `specpair download REPO@COMMIT` (files in parallel,
hashed as they arrive, fsynced, then checked against the Hub's sha256) and a loop of
`huggingface_hub.hf_hub_download` over the same files (one at a time, no hash check). Prints MB/s of each
(median of the runs) and the ratio; then the speed of `specpair verify` re-hashing the downloaded files
(from the page cache: what it measures is sha256 on all cores).

    python benchmarks/download_speed.py [--files 4] [--mb 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from hubserver import FakeHub  # noqa: E402 (tests/ is put on the path first)

HF_BASELINE = """
import sys
from huggingface_hub import hf_hub_download
repo, commit, cache, endpoint, *names = sys.argv[1:]
for name in names:
    hf_hub_download(repo, name, revision=commit, cache_dir=cache, endpoint=endpoint)
"""


def timed(command: list[str], env: dict[str, str], cwd: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command[:4]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--mb", type=int, default=100, help="size of each file in MB")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    files = {
        f"model-{i + 1:05d}-of-{args.files:05d}.safetensors": os.urandom(args.mb * 10**6) for i in range(args.files)
    }
    total = sum(len(data) for data in files.values())
    hub = FakeHub().start()
    repo = hub.add("bench/model", files)
    work = tempfile.mkdtemp(prefix="specpair-download-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1")
    timings: dict[str, list[float]] = {"specpair download": [], "hf_hub_download": []}
    verify_s: list[float] = []
    try:
        for run in range(args.runs):
            cache = os.path.join(work, f"specpair-{run}")
            timings["specpair download"].append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "specpair",
                        "download",
                        f"bench/model@{repo.commit}",
                        "--quiet",
                        "--lock",
                        os.path.join(work, "specpair.lock"),
                    ],
                    {**env, "HF_HUB_CACHE": cache},
                    work,
                )
            )
            verify_s.append(timed([sys.executable, "-m", "specpair", "verify", work, "--quiet"], env, work))
            shutil.rmtree(cache)
            cache = os.path.join(work, f"hf-{run}")
            timings["hf_hub_download"].append(
                timed(
                    [sys.executable, "-c", HF_BASELINE, "bench/model", repo.commit, cache, hub.url, *files], env, work
                )
            )
            shutil.rmtree(cache)
    finally:
        hub.stop()
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"{args.files} files x {args.mb} MB = {total / 1e6:.0f} MB from {hub.url}, {args.runs} runs, "
        f"{os.cpu_count()} cores; median wall time of a fresh process:"
    )
    medians = {}
    for name, values in timings.items():
        medians[name] = statistics.median(values)
        print(
            f"  {name:18} {medians[name]:7.2f} s  {total / 1e6 / medians[name]:8.0f} MB/s  "
            f"(runs: {', '.join(f'{v:.2f}' for v in values)})"
        )
    ratio = medians["hf_hub_download"] / medians["specpair download"]
    print(f"  specpair download runs at {ratio:.2f}x the speed of hf_hub_download, verification included")
    print(
        f"  specpair verify    {statistics.median(verify_s):7.2f} s  {total / 1e6 / statistics.median(verify_s):8.0f} MB/s"
        f"  (re-hash of the same files, process start included)"
    )


if __name__ == "__main__":
    main()
