# syntax=docker/dockerfile:1
# The base image is pinned by tag only: pin it by digest too where you build, e.g.
#   docker buildx imagetools inspect node:26.10.0-bookworm-slim --format '{{json .Manifest.Digest}}'
# then FROM node:26.10.0-bookworm-slim@sha256:<digest> in both stages (no registry was reachable
# when this file was written, so no digest is recorded here rather than an unchecked one).
ARG NODE_IMAGE=node:26.10.0-bookworm-slim

# Build stage: compile TypeScript with the dev dependencies, then keep only production ones.
FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json ./
RUN npm ci --no-audit --no-fund
COPY src ./src
COPY test ./test
RUN npm run build && npm prune --omit=dev

# Runtime stage: compiled code and production dependencies only, as an unprivileged user. No
# configuration is baked in (the demo one holds a public key): mount one at /etc/perch/perch.yaml
# or set PERCH_CONFIG, or perch exits 2 saying it cannot read the configuration file.
FROM ${NODE_IMAGE}
# VERSION matches package.json (a test checks it); SOURCE is the repository URL, given at build
# time (docker build --build-arg SOURCE=https://...) because this file cannot know where it lives.
ARG VERSION=0.2.0
ARG SOURCE=""
LABEL org.opencontainers.image.title="perch" \
      org.opencontainers.image.description="Caching, rate-limiting reverse proxy for a read-only social-account data API" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="MIT"
ENV NODE_ENV=production
ENV PERCH_CONFIG=/etc/perch/perch.yaml
WORKDIR /app
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist/src ./dist/src
RUN ln -s /app/dist/src/main.js /usr/local/bin/perch && chmod +x /app/dist/src/main.js
USER node
EXPOSE 8080
# Reads the same configuration as the server, so it asks the configured port and scheme.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["perch", "--health-check"]
ENTRYPOINT ["perch"]
