# One image for every gradcode role; docker-compose.yml and deploy/kubernetes pick the command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1 \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /app
COPY pyproject.toml README.md ./
COPY common ./common
COPY master ./master
COPY worker ./worker
COPY protos ./protos
COPY gradcode ./gradcode
RUN pip install . \
    && groupadd --system --gid 10001 gradcode \
    && useradd --system --uid 10001 --gid gradcode --home-dir /var/lib/gradcode --no-create-home gradcode \
    && mkdir -p /runs /var/lib/gradcode \
    && chown gradcode:gradcode /runs /var/lib/gradcode

# Never root: a numeric user, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 50050 50051 9464
CMD ["gradcode", "master"]
