# The reliableq image used by docker-compose.yml: the package and its CLI, nothing else.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml hatch_build.py README.md ./
COPY reliableq ./reliableq
COPY stages ./stages
COPY sql ./sql
RUN pip install --no-cache-dir . && useradd --create-home reliableq
USER reliableq
ENTRYPOINT ["reliableq"]
