# minimega: the course site, the graded exam service and the labs in one image.
#
#   docker build -t minimega .                                   # CPU (torch 2.13.0 CPU wheel)
#   docker build -t minimega:cuda \
#     --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#   docker run -p 127.0.0.1:8000:8000 -v minimega-var:/app/var -e MINIMEGA_DEV=1 minimega   # your machine only
#   docker run -p 8888:8888 minimega jupyter lab --ip 0.0.0.0 --no-browser --notebook-dir labs
#
# Sign-in links: the service refuses to start until it is told how to deliver them. A deployment mails
# them: -e MINIMEGA_SMTP_HOST=smtp.example.org [-e MINIMEGA_SMTP_PORT=587 (STARTTLS) or 465 (TLS)]
# -e MINIMEGA_SMTP_USER=… -e MINIMEGA_SMTP_PASSWORD=… -e MINIMEGA_SMTP_FROM="Course <exam@example.org>"
# -e MINIMEGA_BASE_URL=https://<your host> (the origin the mailed links point to). MINIMEGA_DEV=1 shows
# the links on the page and in the log instead: anyone who reaches the port can sign in as anyone, so
# publish the port on 127.0.0.1 only, as above.
#
# The signing key: a development key is created in /app/var/keys on first start (the log says so
# loudly). For real certificates pass -e MINIMEGA_SIGNING_KEY=z3u2… from a secret store and
# -e MINIMEGA_ISSUER_DID=did:web:<your host>. On start the site is rebuilt when its pinned issuers
# (/verify/trusted-issuers.json) are not this service's keys, so the verify page trusts them.
#
# The graded bank: outside MINIMEGA_DEV=1 the service refuses to start without a private bank (the repository's
# quizzes/exam is the public sample): mount it read-only and name it, -v /srv/bank:/banks:ro
# -e MINIMEGA_EXAM_BANKS=/banks, after `minimega exam check-bank /srv/bank` (OPERATING.md). Put a reverse proxy in
# front (compose.yaml runs Caddy with client timeouts) and pass its address to --forwarded-allow-ips.
#
# The database: SQLite in /app/var by default (one instance). Several instances behind a load balancer share
# one PostgreSQL database: -e MINIMEGA_DB=postgresql://minimega@db:5432/minimega -e PGPASSWORD=… (the
# password only in PGPASSWORD, never in the URL of a command line), the same MINIMEGA_BASE_URL and the same
# MINIMEGA_SIGNING_KEY on each. `docker compose up` (compose.yaml) runs the site this way.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 \
    NO_MKDOCS_2_WARNING=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# CUDA bases have no Python: install the distribution's (python:* bases skip this).
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --create-home --uid 1000 learner

# Node.js builds the site: tools/math_hook.py typesets its formulas with KaTeX when the site is built.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Dependencies first (a layer that survives source edits), installed as `make` installs them: tools/setup_venv.py
# (uv, pip as the fallback), the Makefile's torch pin, `make serve`'s extras (site,serve) plus the labs' (lab, as
# `make lab`). torch alone comes from TORCH_INDEX (the CPU wheel by default), everything else from PyPI.
COPY pyproject.toml README.md ./
COPY tools/setup_venv.py ./tools/
COPY src ./src
RUN python3 tools/setup_venv.py --venv /opt/venv --extras lab,site,serve \
        --torch "torch==2.13.0" --torch-index "${TORCH_INDEX}"

COPY . .
RUN if [ -f mkdocs.yml ]; then mkdocs build -q; fi \
    && mkdir -p var \
    && chown -R learner:learner /app

USER 1000:1000
VOLUME ["/app/var"]
EXPOSE 8000 8888
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/v1/health', timeout=4)"]
CMD ["minimega", "serve", "--host", "0.0.0.0", "--port", "8000"]
