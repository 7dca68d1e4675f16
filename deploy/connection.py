"""Write a ``[superlink.<name>]`` connection into the config.toml of a given FLWR_HOME."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import tomli_w

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def write_connection(
    flwr_home: Path,
    name: str,
    address: str,
    root_certificates: Path | None = None,
    make_default: bool = True,
) -> Path:
    """Add or replace ``[superlink.<name>]`` (insecure, or TLS with ``root-certificates``).

    Only the given FLWR_HOME's config.toml is touched (never ``~/.flwr`` unless you pass
    it). With ``make_default`` the connection also becomes ``[superlink] default``, so
    ``flwr ls`` / ``flwr log`` without a connection argument use it.
    """
    if not _NAME.match(name):
        raise ValueError(
            f"connection name {name!r} is not allowed: use letters, digits, '-' and '_' "
            "(no dots), e.g. 'fedhetero-deploy'"
        )
    path = Path(flwr_home) / "config.toml"
    config = tomllib.loads(path.read_text()) if path.is_file() else {}
    links = config.setdefault("superlink", {})
    entry: dict[str, object] = {"address": address}
    if root_certificates is None:
        entry["insecure"] = True
    else:
        entry["root-certificates"] = str(Path(root_certificates).resolve())
    links[name] = entry
    if make_default or "default" not in links:
        links["default"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(config))
    return path
