# syntax=docker/dockerfile:1
#
# Switchboard image: one image, three roles, picked by the command:
#   switchboard migrate   one-shot, applies migrations/ then exits
#   switchboard api       (default) FastAPI on 0.0.0.0:$SWITCHBOARD_HTTP_PORT
#   switchboard worker    Temporal worker
#
# The project is installed *editable* from /app. `switchboard migrate` reads the SQL files from the
# source tree (/app/migrations, a sibling of the packages), and a regular `pip install .` would copy the
# packages into site-packages and leave migrations/ behind. With `pip install -e .` the packages are
# imported from /app, so /app/migrations sits next to them (and WORKDIR /app covers a cwd-relative
# lookup too).

ARG PYTHON_IMAGE=python:3.11-slim
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

WORKDIR /app

# Dependencies first, from pyproject.toml alone, so editing source does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The whole project (see .dockerignore), then the project itself, editable, without touching the deps.
COPY . .
RUN pip install --no-deps -e . \
 && python -m compileall -q routing store activities workflows api runtime switchboard cli worker.py \
 && test -d /app/migrations \
 && switchboard --help > /dev/null

USER switchboard:switchboard

EXPOSE 8000

# Only meaningful for `switchboard api`; compose disables it for migrate and worker.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:' + os.environ.get('SWITCHBOARD_HTTP_PORT', '8000') + '/healthz', timeout=4)"]

CMD ["switchboard", "api"]
