# One image for the API, the worker and the migration job (see docker-compose.yml).
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

# torch first, pinned, in its own layer. PyPI's Linux build of torch 2.13.0 runs on
# CPU and CUDA; for a smaller CPU-only image build with e.g.
#   --build-arg TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
ARG TORCH_SPEC="torch==2.13.0"
RUN pip install ${TORCH_SPEC}

WORKDIR /app
COPY pyproject.toml README.md ./
COPY halfcast ./halfcast
COPY server ./server
COPY worker ./worker
COPY trainer ./trainer
COPY migrations ./migrations
# Every extra: the image runs the API, the worker and the migrations (pyproject.toml's `all`).
RUN pip install '.[all]'

# Run as an unprivileged user; a named volume mounted at the data directory takes
# this directory's owner when it is first created.
RUN useradd --create-home --uid 1000 halfcast \
    && mkdir -p /var/lib/halfcast && chown halfcast /var/lib/halfcast
USER halfcast
ENV HALFCAST_DATA_DIR=/var/lib/halfcast
EXPOSE 8000
CMD ["halfcast", "api"]
