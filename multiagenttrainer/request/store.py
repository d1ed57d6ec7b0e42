"""Where requests live: `<request.output_dir>/requests/<id>/`, with request.json saying how far each got.

request.json is rewritten (atomically) as each agent starts and when the request ends; endpoint.json
exists while the request's server runs. Both are read back as untrusted files: one that is damaged is
skipped by `mat request status` with a warning naming it, never a traceback.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import Config, expand_path
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.processes import pid_alive

REQUESTS_DIR = "requests"
STATE_FILE = "request.json"
ENDPOINT_FILE = "endpoint.json"
MAX_STATE_BYTES = 1 << 20

Stage = Literal["plan", "data", "review", "model", "serve", "done"]
Outcome = Literal["running", "refused", "met", "not met", "failed"]


@dataclass
class RequestState:
    """request.json: what the request is, which agent has it, and how it ended."""

    id: str
    name: str
    task: str = ""
    stage: Stage = "plan"
    outcome: Outcome = "running"
    created_at: str = field(default_factory=now_iso)
    updated_at: str = field(default_factory=now_iso)
    finished_at: str | None = None
    reasons: list[str] = field(default_factory=list)  # refusals, or the requirements not met
    error: str | None = None
    flow_run_id: str | None = None

    def save(self, request_dir: Path) -> None:
        self.updated_at = now_iso()
        write_json_atomically(request_dir / STATE_FILE, asdict(self))


_STATE: TypeAdapter[RequestState] = TypeAdapter(RequestState)


@dataclass(frozen=True)
class Endpoint:
    """endpoint.json: where the request's model is served and the server process to stop."""

    url: str  # the OpenAI base URL, http://host:port/v1
    model: str
    pid: int
    log: str
    started_at: str

    @property
    def running(self) -> bool:
        return pid_alive(self.pid)


_ENDPOINT: TypeAdapter[Endpoint] = TypeAdapter(Endpoint)


# --------------------------------------------------------------------------- paths and ids


def requests_root(cfg: Config, output_dir: str | Path | None = None) -> Path:
    """`<output_dir>/requests`, absolute (`--output-dir`, else request.output_dir)."""
    base = expand_path(str(output_dir)) if output_dir is not None else expand_path(cfg.request.output_dir)
    return (base / REQUESTS_DIR).resolve()


def new_request_id(name: str) -> str:
    """`<name>-<UTC time>-<random>`: unique, sortable by time, safe as a folder name."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{safe(name) or 'request'}-{stamp}-{uuid.uuid4().hex[:6]}"


def safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-.")[:64]


def request_dir(root: Path, request_id: str) -> Path:
    """The folder of one request; ConfigError when the id is not one (no path tricks)."""
    if not request_id or safe(request_id) != request_id:
        raise ConfigError(f"{request_id!r} is not a request id; `mat request status` lists them")
    folder = root / request_id
    if not (folder / STATE_FILE).is_file():
        raise ConfigError(f"no request {request_id} in {root}; `mat request status` lists them")
    return folder


# --------------------------------------------------------------------------- reading back


def read_json_object(path: Path) -> dict[str, Any]:
    """A small JSON object from a file; ValueError or OSError saying what is wrong with it."""
    if path.stat().st_size > MAX_STATE_BYTES:
        raise ValueError(f"larger than {MAX_STATE_BYTES // 1024} KiB")
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def read_state(folder: Path) -> RequestState:
    """request.json of a request folder; ValueError when it is damaged."""
    try:
        return _STATE.validate_python(read_json_object(folder / STATE_FILE))
    except ValidationError as exc:
        raise ValueError(exc.errors()[0]["msg"]) from None


def read_endpoint(folder: Path) -> Endpoint | None:
    """endpoint.json while the request's server is recorded; None when there is none or it is damaged."""
    path = folder / ENDPOINT_FILE
    if not path.is_file():
        return None
    try:
        return _ENDPOINT.validate_python(read_json_object(path))
    except (OSError, ValueError, ValidationError, RecursionError):
        return None


def write_endpoint(folder: Path, endpoint: Endpoint) -> None:
    write_json_atomically(folder / ENDPOINT_FILE, asdict(endpoint))


def status_rows(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per request under `root`, oldest first, and a warning per damaged request.json."""
    rows, warnings = [], []
    for path in sorted(root.glob(f"*/{STATE_FILE}")):
        try:
            state = read_state(path.parent)
        except (OSError, ValueError, RecursionError) as exc:
            warnings.append(f"{path}: not a valid request record ({exc}); skipped; restore it or delete it")
            continue
        rows.append(status_row(path.parent, state))
    return sorted(rows, key=lambda row: str(row["created_at"])), warnings


def status_row(folder: Path, state: RequestState) -> dict[str, Any]:
    """What `mat request status` shows of one request."""
    endpoint = read_endpoint(folder)
    live = endpoint is not None and endpoint.running
    return {
        **asdict(state),
        "dir": str(folder),
        "endpoint": endpoint.url if endpoint is not None and live else None,
        "model": endpoint.model if endpoint is not None and live else None,
    }
