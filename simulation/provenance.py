"""Where a run's numbers came from: the git commit of the code that ran it, whether the tree
was dirty, and the seed of everything random (``provenance.json`` in the run directory).

Under ``flwr run`` the ServerApp runs from a copy of the project (Flower's FAB), which is no
git checkout, so the tool that launched the run (``sweep``, ``run``) writes this file
beside the run log once the run has ended; a resumed run appends one entry per launch.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from fedapp.run_log import log_path, read_log_text

PROVENANCE = "provenance.json"
SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the checkout this tool runs from
UNKNOWN = "unknown"


def git_state(root: Path = SOURCE_ROOT) -> dict[str, object]:
    """{"git-commit": HEAD's hash, "git-dirty": whether tracked or untracked files differ
    from it}; "unknown" / None where ``root`` is no git checkout or git is missing."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True, timeout=30).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], check=True,
                                capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {"git-commit": UNKNOWN, "git-dirty": None}
    return {"git-commit": commit, "git-dirty": bool(status.strip())}


def seeds_of(run_config: Mapping[str, object]) -> dict[str, object]:
    """Every seed the run config sets, with what -1 ("the run's seed") resolves to: the run
    seed draws the initial model, the sampling, the batch order and the device fleet."""
    seed = run_config.get("seed", 0)
    found = {key: value for key, value in sorted(run_config.items()) if key.endswith("seed")}
    found.setdefault("seed", seed)
    for key, value in list(found.items()):
        if key != "seed" and value == -1:
            found[key] = seed
    return found


def record(run_dir: Path, run_config: Mapping[str, object], action: str,
           state: Mapping[str, object] | None = None) -> Path:
    """Append this launch (``action``: "ran" / "resumed") to ``run_dir/provenance.json``; an
    unreadable existing file is kept aside as ``provenance.json.bad``, not lost."""
    path = Path(run_dir) / PROVENANCE
    entries = read(run_dir, keep_bad=True)
    entries.append({"action": action, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    **(state if state is not None else git_state()),
                    "seeds": seeds_of(run_config)})
    path.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    return path


def read(run_dir: Path, keep_bad: bool = False) -> list[dict]:
    """The launches recorded in ``run_dir`` (``provenance.json``, or ``.xz`` in an archived
    run; [] when there is none; a damaged one is named on stdout and, with ``keep_bad``,
    renamed to ``provenance.json.bad``)."""
    path = log_path(Path(run_dir), PROVENANCE)  # plain, or compressed by archive-logs
    if not path.is_file():
        return []
    try:
        entries = json.loads(read_log_text(path))
        if not (isinstance(entries, list) and all(isinstance(e, dict) for e in entries)):
            raise ValueError("not a list of objects")
        return entries
    except (OSError, ValueError) as exc:
        print(f"{path}: unreadable provenance ({exc}); it is left out", flush=True)
        if keep_bad:
            path.replace(path.with_name(PROVENANCE + ".bad"))
        return []


def commits_line(run_dirs: list[Path]) -> str:
    """One sentence naming the commits that produced the runs, how many runs came from a
    dirty tree, and how many carry no record."""
    commits: dict[str, int] = {}
    dirty = missing = 0
    for run_dir in run_dirs:
        entries = read(run_dir)
        if not entries:
            missing += 1
            continue
        for entry in entries:
            commits[str(entry.get("git-commit", UNKNOWN))[:12]] = \
                commits.get(str(entry.get("git-commit", UNKNOWN))[:12], 0) + 1
        dirty += any(entry.get("git-dirty") for entry in entries)
    parts = [", ".join(f"{c} ({n} launch{'es' if n > 1 else ''})"
                       for c, n in sorted(commits.items()))] if commits else []
    text = f"Code: commit {parts[0]}" if parts else "Code: no run records its commit"
    text += f"; {dirty} of {len(run_dirs)} runs from a tree with uncommitted changes"
    if missing and commits:
        text += f"; {missing} runs carry no provenance record"
    return text + "."
