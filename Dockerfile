# Build: the locked dependencies into a venv, without the dev group.
# (No `# syntax=` line: BuildKit would fetch that frontend image; nothing here needs it.)
FROM python:3.11-slim AS build
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/opt/venv
RUN pip install --no-cache-dir "uv==0.13.9"
WORKDIR /src
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project

# Run: slim, non-root, the venv and the code only.
FROM python:3.11-slim AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PARLEY_HOST=0.0.0.0 \
    PARLEY_PORT=8000
# /app belongs to the runtime user: the default SQLite database (./parley.db) is created
# there; /app/data is the place for a volume (DATABASE_URL=sqlite:///./data/parley.db).
RUN groupadd --system parley && useradd --system --gid parley --home /app parley \
    && install -d -o parley -g parley /app /app/data
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=parley:parley alembic.ini ./
COPY --chown=parley:parley migrations ./migrations
COPY --chown=parley:parley app ./app
USER parley
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]
# On its own (`docker run`), serve migrates first. Compose runs migrations as their own
# step (the `migrate` service) and the API with --no-migrate, so replicas never race.
CMD ["python", "-m", "app", "serve"]
