"""A new user's first hour, as CI checks it: the wheel, then the quickstart, word for word.

    python scripts/first_hour.py [--python python3] [--keep]

1. Builds the sdist and the wheel, and checks the wheel holds the templates, static
   files, migrations and ``py.typed``.
2. Makes a fresh virtual environment and installs the wheel (not editable) with only the
   ``postgres`` extra, as ``pip install "django-exclusive-jobs[postgres]"`` would.
3. Follows ``docs/quickstart.md`` as written: every block marked with an HTML comment
   ``<!-- quickstart: run -->``, ``<!-- quickstart: write PATH -->`` or
   ``<!-- quickstart: append PATH -->`` is run or written, in order, in a new directory.
   The quickstart's own ``pip install`` line installs the wheel instead of the index's.
4. Shows that ``check`` and ``migrate`` passed (they are quickstart steps), that two
   racing ``run_exclusive`` calls give one run, that the admin page for locks answers
   200 to a staff user, and that ``exclusive_scheduler`` started from ``/`` (a systemd
   unit without ``WorkingDirectory``) runs a job in its own process.

Needs PostgreSQL on 127.0.0.1:5432 (trust auth, user postgres); the quickstart's
settings name the database ``mysite``, which this script drops and creates.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"
STEP = re.compile(
    r"<!-- quickstart: (run|write|append)\s*(\S*)\s*-->\s*\n```[^\n]*\n(.*?)```", re.S
)
WHEEL_MUST_HOLD = [
    "django_exclusive_jobs/py.typed",
    "django_exclusive_jobs/migrations/0001_initial.py",
    "django_exclusive_jobs/static/django_exclusive_jobs/admin.css",
    "django_exclusive_jobs/templates/admin/django_exclusive_jobs/joblock/change_list.html",
]


def steps(text: str) -> list[tuple[str, str, str]]:
    """(kind, path, body) for each marked block of the quickstart, in order."""
    found = [(kind, path, body) for kind, path, body in STEP.findall(text)]
    if not found:
        raise SystemExit(f"{QUICKSTART}: no '<!-- quickstart: ... -->' steps found")
    return found


def say(text: str) -> None:
    print(f"[first-hour] {text}", flush=True)


def run(argv: list[str], cwd: Path, env: dict[str, str], **kwargs: object) -> str:
    say("$ " + " ".join(shlex.quote(a) for a in argv))
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"failed ({result.returncode}): {' '.join(argv)}")
    return str(result.stdout)


def build(python: str, out: Path, env: dict[str, str]) -> Path:
    run([python, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)], ROOT, env)
    wheel = next(out.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in WHEEL_MUST_HOLD if name not in names]
    if missing:
        raise SystemExit(f"the wheel lacks: {', '.join(missing)}")
    if not list(out.glob("*.tar.gz")):
        raise SystemExit("no sdist was built")
    say(f"built {wheel.name} ({len(names)} files) and the sdist")
    return wheel


def recreate_database(name: str) -> None:
    import psycopg  # the dev environment's driver; the new project has its own

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        db.execute(f"CREATE DATABASE {name}")


def follow_quickstart(work: Path, venv: Path, wheel: Path, env: dict[str, str]) -> Path:
    """Run the quickstart's steps; return the directory it ends in (the project)."""
    here = work
    env = {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}", "VIRTUAL_ENV": str(venv)}
    for kind, path, body in steps(QUICKSTART.read_text()):
        if kind == "write":
            say(f"write {path}")
            (here / path).parent.mkdir(parents=True, exist_ok=True)
            (here / path).write_text(body)
        elif kind == "append":
            say(f"append to {path}")
            with (here / path).open("a") as handle:
                handle.write("\n" + body)
        else:
            for line in body.strip().splitlines():
                words = shlex.split(line, comments=True)
                if not words:
                    continue
                if words[0] == "cd":
                    here = here / words[1]
                elif words[:2] == ["pip", "install"]:
                    extras = re.search(r"\[(.*)\]", line)
                    spec = f"{wheel}[{extras.group(1)}]" if extras else str(wheel)
                    run([str(venv / "bin" / "pip"), "install", "-q", spec], here, env)
                else:
                    print(run(words, here, env), end="")
    return here


def race_two_servers(project: Path, env: dict[str, str]) -> None:
    python = str(Path(env["VIRTUAL_ENV"]) / "bin" / "python")
    run([python, "manage.py", "shell", "-v", "0", "-c", CLEAR_RUNS], project, env)
    argv = [python, "manage.py", "run_exclusive", "hourly_report"]
    racers = [
        subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    codes = [racer.returncode for racer in racers]
    runs = run([python, "manage.py", "shell", "-v", "0", "-c", COUNT_RUNS], project, env).strip()
    say(f"two racing servers: exit codes {codes}, runs recorded: {runs}")
    if codes != [0, 0] or runs != "1" or sum("skipped" in out for out in outputs) != 1:
        raise SystemExit(
            "two racing run_exclusive calls did not give exactly one run:\n" + "".join(outputs)
        )


CLEAR_RUNS = "from django_exclusive_jobs.models import JobRun; JobRun.objects.all().delete()"
COUNT_RUNS = "from django_exclusive_jobs.models import JobRun; print(JobRun.objects.count())"
ASK_FOR_A_RUN = """
from django_exclusive_jobs.run import control
print(control.request_run("hourly_report", by="first-hour", using="default").pk)
"""
RUN_STATUS = """
from django_exclusive_jobs.models import RunRequest
run = RunRequest.objects.get(pk={pk}).run
print(run.status if run else "waiting")
"""


def scheduler_from_another_folder(project: Path, env: dict[str, str]) -> None:
    """The installed wheel's scheduler, started from "/" by the absolute path of
    manage.py, serves a "run now" in a job process of its own."""
    import time

    python = str(Path(env["VIRTUAL_ENV"]) / "bin" / "python")
    shell = [python, "manage.py", "shell", "-v", "0", "-c"]
    pk = run([*shell, ASK_FOR_A_RUN], project, env).strip()
    argv = [python, str(project / "manage.py"), "exclusive_scheduler"]
    say("$ cd / && " + " ".join(argv))
    scheduler = subprocess.Popen(argv, cwd="/", env=env, stdout=subprocess.PIPE, text=True)
    status = "waiting"
    try:
        deadline = time.monotonic() + 60
        while status in ("waiting", "running") and time.monotonic() < deadline:
            time.sleep(1)
            status = run([*shell, RUN_STATUS.format(pk=pk)], project, env).strip()
    finally:
        scheduler.terminate()
        output = scheduler.communicate(timeout=60)[0]
    say(f"the scheduler started from / ran hourly_report: {status}")
    if status != "succeeded" or scheduler.returncode != 0:
        raise SystemExit(f"the scheduler started from / did not run the job:\n{output}")


ADMIN_PAGE = """
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
User.objects.create_user("staff", password="pw", is_staff=True, is_superuser=True)
client = Client()
assert client.login(username="staff", password="pw")
print(client.get("/admin/django_exclusive_jobs/joblock/").status_code)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the Python to install into")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON"))}
    work = Path(tempfile.mkdtemp(prefix="first-hour-"))
    try:
        run([sys.executable, "-m", "pip", "install", "-q", "build"], ROOT, env)
        wheel = build(sys.executable, work / "dist", env)
        venv = work / "venv"
        run([args.python, "-m", "venv", str(venv)], work, env)
        recreate_database("mysite")
        project = follow_quickstart(work, venv, wheel, env)
        env = {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}", "VIRTUAL_ENV": str(venv)}
        race_two_servers(project, env)
        status = run(
            [str(venv / "bin" / "python"), "manage.py", "shell", "-v", "0", "-c", ADMIN_PAGE],
            project,
            env,
        )
        if status.strip() != "200":
            raise SystemExit(f"the admin page for locks answered {status.strip()}, not 200")
        say("the admin page for locks answers 200 to a staff user")
        scheduler_from_another_folder(project, env)
        say("passed: wheel, quickstart, check, migrate, one run of two, admin page, scheduler")
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
