"""The startup script that turns a fresh TPU VM, or every host of a TPU slice, into traindeck
workers.

Google runs a node's `startup-script` metadata as root at every boot, on every host of the
node. For a single-host TPU VM the script starts one worker, `tpu-<node name>`. For a
multi-host slice (`slice_hosts` > 1, requested as a queued resource by `cloud.slices`) every
host runs the same script and starts its own worker, with `--worker-id tpu-<node name>` and
`TRAINDECK_SLICE=<node name>` on each: the worker finds its host number N as libtpu does and
names itself `tpu-<node name>-host<N>` on host N > 0 (`cloud.tpu.worker_id_for_host`). The
script learns N first, from the TPU metadata server (`instance/attributes/agent-worker-number`)
or `TPU_WORKER_ID` where the server does not answer, only so that a host that cannot tell
starts no worker. It hands the worker no host number: the worker finds its place itself from
the sources its job process's libtpu reads (`worker.tpu_slice`), and a number without the
slice's host addresses could not run a job anyway. Running one job across the hosts is the
workers' business (gang execution); none of it was ever run on a real slice.

Ours installs Python 3.11, brings
traindeck onto the VM (a git repository or a tarball), installs the pinned stack from
traindeck's requirements.lock plus `torch_xla[tpu]` (which brings libtpu), and starts
`python -m worker --worker-id tpu-<node name>` under systemd with `PJRT_DEVICE=TPU`, the
shared `DATABASE_URL` and the shared store (`TRAINDECK_STORE`, a gs:// bucket: every file
another machine needs goes through it). It is idempotent: a reboot (a stop and start of the
node) reuses the virtual environment while requirements.lock is unchanged, and updates the
code.

The script is a fixed body that reads a few variables set at its top; the values are checked
here (`BootstrapSettings.problems`) and shell-quoted, so nothing a person types can turn into
a command. The page shows the script and lets the person edit it before creating the node.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

from cloud.tpu import EXPERIMENTAL_SLICE, NODE_NAME_PATTERN, worker_id_for_node
from common.store import StoreError, validate_store_url

TORCH_XLA_VERSION = "2.9.0"  # must match requirements.txt (a test checks)
TORCH_XLA_REQUIREMENT = f"torch_xla[tpu]=={TORCH_XLA_VERSION}"
DEFAULT_DATA_DIR = "/opt/traindeck/data"
DEFAULT_SOURCE_REF = "main"
MAX_HOSTS = 4096  # more than any TPU slice has (a v5p pod is 8960 chips, 4 a host: 2240)
POSTGRES_SCHEMES = ("postgres", "postgresql", "postgresql+psycopg")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")

_GIT_URL = re.compile(r"^(https?|ssh|git)://[^\s'\"\\$`]+$|^[\w.-]+@[\w.-]+:[^\s'\"\\$`]+$")
_TARBALL_URL = re.compile(r"^https?://[^\s'\"\\$`]+\.(tar\.gz|tgz)$")
_GIT_REF = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._/-]*$")
_DATA_DIR = re.compile(r"^/[A-Za-z0-9._/-]*$")
# Characters that would need escaping in the systemd EnvironmentFile; URL-encode them instead.
_UNSAFE_IN_ENV_FILE = re.compile(r"[\s'\"\\$`]")


@dataclass(frozen=True)
class BootstrapSettings:
    """What the startup script needs to know."""

    node_name: str
    database_url: str
    source_url: str
    source_ref: str = DEFAULT_SOURCE_REF
    data_dir: str = DEFAULT_DATA_DIR
    # The bucket the dashboard and every worker share (TRAINDECK_STORE); empty: none.
    store_url: str = ""
    # How many TPU VM hosts the node has (the Cloud TPU API's topology): more than one, and
    # every host starts a worker of its own.
    slice_hosts: int = 1

    @property
    def worker_id(self) -> str:
        """The id the worker is started with; on a slice, on every host (the worker of host
        N > 0 adds -host<N> to it)."""
        return worker_id_for_node(self.node_name)

    @property
    def is_slice(self) -> bool:
        return self.slice_hosts > 1

    @property
    def source_is_tarball(self) -> bool:
        return bool(_TARBALL_URL.match(self.source_url))

    def problems(self) -> list[str]:
        """Everything that keeps these settings from making a working worker."""
        found = []
        if not NODE_NAME_PATTERN.match(self.node_name):
            found.append(f"The node name {self.node_name!r} is not a valid TPU VM name.")
        if not isinstance(self.slice_hosts, int) or not 1 <= self.slice_hosts <= MAX_HOSTS:
            found.append(
                f"The number of hosts {self.slice_hosts!r} is not a whole number from 1 to "
                f"{MAX_HOSTS}."
            )
        found += database_url_problems(self.database_url)
        found += store_url_problems(self.store_url)
        if not self.source_url:
            found.append(
                "Say where the VM gets traindeck: a git URL (https://…/traindeck.git) or a "
                "tarball URL (…/traindeck.tar.gz) that the VM can download."
            )
        elif not (_GIT_URL.match(self.source_url) or self.source_is_tarball):
            found.append(
                f"The source {self.source_url!r} is neither a git URL (https://, ssh://, "
                "git@host:path) nor a tarball URL ending in .tar.gz or .tgz."
            )
        if not self.source_is_tarball and not _GIT_REF.match(self.source_ref):
            found.append(f"The git branch or tag {self.source_ref!r} is not a valid name.")
        if not _DATA_DIR.match(self.data_dir) or ".." in self.data_dir.split("/"):
            found.append(
                f"The data folder {self.data_dir!r} must be an absolute path of letters, "
                "digits, '.', '_', '-' and '/'."
            )
        return found


def database_url_problems(url: str) -> list[str]:
    """Why `url` cannot be the queue that workers on other machines share, if it cannot."""
    if not url.strip():
        return ["Set the database URL the workers use: the shared Postgres server."]
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme.startswith("sqlite"):
        return [
            "The database is a SQLite file on this machine, which a TPU VM cannot open. "
            "Workers on several machines share one Postgres database: set DATABASE_URL to "
            "postgresql://user:password@host:5432/traindeck (for the dashboard too)."
        ]
    if scheme not in POSTGRES_SCHEMES:
        return [f"The database URL must be a postgresql:// URL, not {scheme or url!r}://…"]
    found = []
    if _UNSAFE_IN_ENV_FILE.search(url):
        found.append(
            "The database URL contains a space, a quote, a backslash, '$' or '`': "
            "URL-encode them (e.g. %24 for $)."
        )
    try:
        host = parts.hostname
    except ValueError:
        host = None
    if not host:
        found.append("The database URL names no host the VM could connect to.")
    elif host in LOCAL_HOSTS:
        found.append(
            f"The database URL points at {host}, which on the TPU VM is the VM itself: use "
            "an address the VM can reach (the database server's private IP, or Cloud SQL)."
        )
    return found


STORE_NOT_SHARED = (
    "The store is a folder on this machine, and workers on other machines cannot read this "
    "machine's folder: set TRAINDECK_STORE to a gs:// bucket (gs://BUCKET/PREFIX), for the "
    "dashboard and the workers alike."
)


def store_url_problems(url: str) -> list[str]:
    """Why `url` cannot be the store that the dashboard and the VM's worker share, if it cannot."""
    if not url.strip():
        return [STORE_NOT_SHARED]
    try:
        validate_store_url(url.strip())
    except StoreError as exc:
        return [str(exc)]
    if _UNSAFE_IN_ENV_FILE.search(url.strip()):
        return ["The store URL contains a space, a quote, a backslash, '$' or '`'."]
    return []


def build_startup_script(settings: BootstrapSettings) -> str:
    """The startup script for `settings` (which must have no `problems()`)."""
    problems = settings.problems()
    if problems:
        raise ValueError(" ".join(problems))
    values = {"WORKER_ID": settings.worker_id}
    if settings.is_slice:
        values |= {"TRAINDECK_SLICE": settings.node_name, "SLICE_HOSTS": str(settings.slice_hosts)}
    values |= {
        "SOURCE_URL": settings.source_url,
        "SOURCE_REF": settings.source_ref,
        "DATABASE_URL": settings.database_url.strip(),
        "TRAINDECK_STORE": validate_store_url(settings.store_url.strip()),
        "TRAINDECK_DATA": settings.data_dir,
        "TORCH_XLA_REQUIREMENT": TORCH_XLA_REQUIREMENT,
    }
    assignments = "\n".join(f"{name}={shlex.quote(value)}" for name, value in values.items())
    if settings.is_slice:
        header = (
            "#!/bin/bash\n"
            f"# traindeck worker bootstrap for the TPU slice {settings.node_name}, written by the\n"
            f"# traindeck dashboard, for each of its {settings.slice_hosts} hosts "
            f"({EXPERIMENTAL_SLICE}).\n"
            "# Google runs it as root at every boot of every host; each starts its own worker.\n"
            "# Its log: /var/log/traindeck-bootstrap.log; the worker's: journalctl -u "
            "traindeck-worker\n"
        )
        return f"{header}\n{assignments}\n{SLICE_STEPS}{SCRIPT_BODY}{SLICE_MAIN}"
    header = (
        "#!/bin/bash\n"
        f"# traindeck worker bootstrap for the TPU VM {settings.node_name}, written by the\n"
        "# traindeck dashboard, for a single-host TPU VM. Google runs it as root at every boot.\n"
        "# Its log: /var/log/traindeck-bootstrap.log; the worker's: journalctl -u "
        "traindeck-worker\n"
    )
    return f"{header}\n{assignments}\n{SCRIPT_BODY}{SINGLE_HOST_MAIN}"


SCRIPT_BODY = r"""
BASE=/opt/traindeck
SRC="$BASE/src"
VENV="$BASE/venv"
ENV_FILE=/etc/traindeck/worker.env
UNIT_FILE=/etc/systemd/system/traindeck-worker.service

install_system_packages() {
    if command -v python3.11 >/dev/null && python3.11 -c 'import ensurepip' 2>/dev/null \
        && command -v git >/dev/null && command -v curl >/dev/null; then
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    # At first boot unattended-upgrades may hold the dpkg lock for minutes: wait for it.
    apt-get -o DPkg::Lock::Timeout=900 update -q
    apt-get -o DPkg::Lock::Timeout=900 install -y -q python3.11 python3.11-venv git curl \
        ca-certificates
}

fetch_source() {
    mkdir -p "$BASE"
    case "$SOURCE_URL" in
        *.tar.gz | *.tgz)
            rm -rf "$SRC.new"
            mkdir -p "$SRC.new"
            curl -fsSL --retry 5 "$SOURCE_URL" | tar -xz -C "$SRC.new"
            # The tarball holds traindeck at its top or in one folder (as git archives do).
            local top
            top=$(find "$SRC.new" -maxdepth 2 -name requirements.lock -printf '%h\n' \
                | sort | head -n 1)
            if [ -z "$top" ]; then
                echo "error: $SOURCE_URL holds no requirements.lock: is it traindeck?" >&2
                return 1
            fi
            rm -rf "$SRC"
            mv "$top" "$SRC"
            rm -rf "$SRC.new"
            ;;
        *)
            if [ -d "$SRC/.git" ]; then
                git -C "$SRC" fetch --depth 1 origin "$SOURCE_REF"
                git -C "$SRC" checkout --force FETCH_HEAD
            else
                rm -rf "$SRC"
                git clone --depth 1 --branch "$SOURCE_REF" "$SOURCE_URL" "$SRC"
            fi
            ;;
    esac
}

install_python_stack() {
    local stamp
    stamp="$(sha256sum "$SRC/requirements.lock" | cut -d' ' -f1) $TORCH_XLA_REQUIREMENT"
    if [ "$(cat "$VENV/.traindeck-stamp" 2>/dev/null || true)" = "$stamp" ]; then
        return
    fi
    rm -rf "$VENV"
    python3.11 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # The lock pins every package (make lock); torch_xla[tpu] and libtpu come on top.
    "$VENV/bin/python" -m pip install --quiet -r "$SRC/requirements.lock" "$TORCH_XLA_REQUIREMENT"
    echo "$stamp" >"$VENV/.traindeck-stamp"
}

write_worker_service() {
    mkdir -p "$TRAINDECK_DATA" "$(dirname "$ENV_FILE")"
    chmod 700 "$(dirname "$ENV_FILE")"
    (
        umask 077
        cat >"$ENV_FILE" <<ENV
DATABASE_URL=$DATABASE_URL
TRAINDECK_STORE=$TRAINDECK_STORE
TRAINDECK_DATA=$TRAINDECK_DATA
PJRT_DEVICE=TPU
ENV
        if [ -n "${TRAINDECK_SLICE:-}" ]; then
            printf 'TRAINDECK_SLICE=%s\n' "$TRAINDECK_SLICE" >>"$ENV_FILE"
        fi
    )
    cat >"$UNIT_FILE" <<UNIT
[Unit]
Description=traindeck worker $WORKER_ID
After=network-online.target
Wants=network-online.target

[Service]
EnvironmentFile=$ENV_FILE
WorkingDirectory=$SRC
ExecStart=$VENV/bin/python -m worker --worker-id $WORKER_ID
Restart=on-failure
RestartSec=15
# SIGTERM to the supervisor only: it stops its job at the next batch and requeues it (a
# spot VM gets 30 s of notice before a preemption); whatever is left is killed after that.
KillMode=mixed
TimeoutStopSec=150
UNIT
}

bootstrap() {
    echo "== traindeck bootstrap of $WORKER_ID, $(date -Is)"
    install_system_packages
    fetch_source
    install_python_stack
    write_worker_service
    # Not enabled at boot: this script starts it at every boot, once the code is up to date.
    systemctl daemon-reload
    systemctl restart traindeck-worker.service
    echo "== traindeck worker $WORKER_ID started; follow it: journalctl -u traindeck-worker -f"
}
"""

SINGLE_HOST_MAIN = r"""
main() {
    set -euo pipefail
    exec >>/var/log/traindeck-bootstrap.log 2>&1
    bootstrap
}

# TRAINDECK_BOOTSTRAP_DEFINE_ONLY=1 only defines the steps (the tests run them one by one).
if [ "${TRAINDECK_BOOTSTRAP_DEFINE_ONLY:-0}" != 1 ]; then
    main "$@"
fi
"""

# Every host of a slice runs the same script: each asks which host it is first, and starts no
# worker when it cannot tell. Its worker finds its place again itself (worker.tpu_slice).
SLICE_STEPS = r"""
METADATA_RETRIES=5

learn_host_index() {
    local url index
    url="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance"
    url="$url/attributes/agent-worker-number"
    if ! index=$(curl -fsS --max-time 10 --retry "$METADATA_RETRIES" --retry-connrefused \
        -H 'Metadata-Flavor: Google' "$url"); then
        echo "the TPU metadata server did not say which host this is: TPU_WORKER_ID decides"
        index=${TPU_WORKER_ID:-}
    fi
    case "$index" in
        '' | *[!0-9]*)
            echo "error: this host's number is unknown (metadata agent-worker-number and" \
                "TPU_WORKER_ID gave '$index'): no worker is started" >&2
            return 1
            ;;
    esac
    if [ "$index" -ge "$SLICE_HOSTS" ]; then
        echo "error: host $index of a slice of $SLICE_HOSTS hosts: no worker is started" >&2
        return 1
    fi
    HOST_INDEX=$((10#$index))
    echo "== host $HOST_INDEX of the $SLICE_HOSTS hosts of slice $TRAINDECK_SLICE"
}
"""

SLICE_MAIN = r"""
main() {
    set -euo pipefail
    exec >>/var/log/traindeck-bootstrap.log 2>&1
    learn_host_index
    bootstrap
}

# TRAINDECK_BOOTSTRAP_DEFINE_ONLY=1 only defines the steps (the tests run them one by one).
if [ "${TRAINDECK_BOOTSTRAP_DEFINE_ONLY:-0}" != 1 ]; then
    main "$@"
fi
"""
