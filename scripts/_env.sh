# Shared set-up for scripts/test.sh, scripts/demo.sh and .ci/run: sourced, not run.
# Installs what the project needs on a fresh machine and starts the local databases.

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

log() { printf '[setup] %s\n' "$*" >&2; }

ensure_system_packages() {
    # mysqlclient builds against the MariaDB client library.
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        log "missing system packages: ${missing[*]} (install them with your package manager)"
        return 1
    fi
    log "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

wait_for() {  # wait_for SECONDS command...
    local seconds=$1; shift
    for _ in $(seq 1 "$seconds"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 1
    done
    return 1
}

ensure_postgres() {
    command -v pg_isready >/dev/null || { log "PostgreSQL is not installed"; return 1; }
    pg_isready -q -h 127.0.0.1 -p 5432 && return 0
    log "starting PostgreSQL"
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n1)
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    wait_for 60 pg_isready -q -h 127.0.0.1 -p 5432 || { log "PostgreSQL did not start"; return 1; }
}

ensure_mariadb() {
    command -v mariadb-admin >/dev/null || { log "MariaDB is not installed"; return 1; }
    mariadb-admin -h 127.0.0.1 -u root ping >/dev/null 2>&1 && return 0
    log "starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
    wait_for 60 mariadb-admin -h 127.0.0.1 -u root ping || { log "MariaDB did not start"; return 1; }
}

ensure_venv() {
    # $1: the extras to install, e.g. "dev"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    local stamp="$VENV/.installed-$1"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        log "installing the project with [$1] into $VENV"
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$1]" 2>&1 \
            | grep -v "^WARNING: Location" >&2 || true
        "$VENV/bin/python" -c "import django, django_exclusive_jobs" && touch "$stamp"
    fi
}

find_python() {  # find_python 3.12 -> a python3.12 executable, or nothing
    local version=$1 found=""
    if command -v pyenv >/dev/null; then
        found=$(pyenv prefix "$version" 2>/dev/null | head -n1)/bin/python$version
    fi
    [ -x "$found" ] || found=$(command -v "python$version" || true)
    [ -n "$found" ] && [ -x "$found" ] && echo "$found"
}

django_venv() {  # django_venv PYTHON_VERSION DJANGO_SPEC SUFFIX: make .venv-django-SUFFIX
    local version=$1 spec=$2 suffix=$3
    local python venv=".venv-django-$suffix"
    python=$(find_python "$version") || true
    if [ -z "$python" ]; then
        log "no Python $version here: cannot test $spec"
        return 1
    fi
    if [ ! -x "$venv/bin/python" ]; then
        "$python" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$spec" -e ".[postgres,mysql,test]" 2>&1 \
        | grep -v "^WARNING: Location" >&2 || true
}

django_pytest() {  # django_pytest SUFFIX pytest-args...: the tests in .venv-django-SUFFIX
    local suffix=$1 venv=".venv-django-$1"; shift
    log "tests on $("$venv/bin/python" -c 'import django, sys; print("Django", django.get_version(), "Python", sys.version.split()[0])')"
    EXCLUSIVE_JOBS_TEST_DB_SUFFIX="_$suffix" "$venv/bin/python" -m pytest "$@"
}
