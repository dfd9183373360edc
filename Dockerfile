# The farm server image: API, Celery worker and beat (no torch, no executorch: the server never
# runs models, it parses ETDumps with numpy).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 SME2_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sme2farm sme2farm
COPY server server
COPY farm farm
COPY worker worker
COPY agent agent
COPY client client
COPY analysis analysis
COPY runners runners
COPY migrations migrations
RUN pip install ".[server]" && useradd --create-home --uid 10001 farm && mkdir -p /data && chown farm /data \
    && chmod 0700 /data
USER farm
VOLUME ["/data"]
EXPOSE 8000
# umask 077: what the farm writes (models, artifacts, logs) is readable by the farm user only
ENTRYPOINT ["/bin/sh", "-c", "umask 077 && exec \"$@\"", "umask077"]
CMD ["uvicorn", "sme2farm.server.main:app", "--host", "0.0.0.0", "--port", "8000", "--proxy-headers"]
