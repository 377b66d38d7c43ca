# syntax=docker/dockerfile:1
#
# Switchboard image: one image, three roles, picked by the command:
#   switchboard migrate   one-shot, applies migrations/ then exits
#   switchboard api       (default) FastAPI on 0.0.0.0:$SWITCHBOARD_HTTP_PORT
#   switchboard worker    Temporal worker
#
# Reproducible: every dependency is installed at the exact version of constraints.txt (the versions the suite
# passed with; README "Constraints" says how to refresh them). The project is a plain wheel: migrations/ and
# the rule packs are package data inside it, so no source tree is needed at run time. The `embedded` extra
# (embedded PostgreSQL, the Temporal dev server) is not installed: the image connects to real servers.

# A full version, never a floating tag: the same base on every build (tests/test_compose.py holds it so).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# Build stage: the project's wheel, built with the pinned setuptools (no build isolation, so nothing unpinned).
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY . /src
RUN pip install -c /src/constraints.txt setuptools \
 && pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src

FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SWITCHBOARD_HOME=/var/lib/switchboard \
    SWITCHBOARD_HTTP_HOST=0.0.0.0 \
    SWITCHBOARD_HTTP_PORT=8000

# Unprivileged runtime user; its only writable place is SWITCHBOARD_HOME.
RUN groupadd --system --gid 10001 switchboard \
 && useradd --system --uid 10001 --gid switchboard --home-dir /var/lib/switchboard \
        --no-create-home --shell /usr/sbin/nologin switchboard \
 && install -d -o switchboard -g switchboard -m 0750 /var/lib/switchboard

# Dependencies first, from pyproject.toml and constraints.txt alone, so editing source does not reinstall them.
# Only [project].dependencies: no extra (neither dev nor embedded).
COPY pyproject.toml constraints.txt /tmp/deps/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/deps/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/deps/requirements.txt \
 && pip install -c /tmp/deps/constraints.txt -r /tmp/deps/requirements.txt \
 && rm -r /tmp/deps

# The project itself, without touching the deps; then prove the installed copy finds its data files.
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/*.whl \
 && rm -r /tmp/wheels \
 && pip check \
 && switchboard --help > /dev/null \
 && python -c "from switchboard import resources as r; assert r.migration_files() and r.rule_pack_names()"

WORKDIR /var/lib/switchboard

USER switchboard:switchboard

EXPOSE 8000

# Only meaningful for `switchboard api`; compose disables it for migrate and worker.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:' + os.environ.get('SWITCHBOARD_HTTP_PORT', '8000') + '/healthz', timeout=4)"]

CMD ["switchboard", "api"]
