# One image for every gradcode role; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY common ./common
COPY master ./master
COPY worker ./worker
COPY protos ./protos
COPY gradcode ./gradcode
RUN pip install .

EXPOSE 50050 50051
CMD ["gradcode", "master"]
