# syntax=docker/dockerfile:1
# Build stage: compile TypeScript with the dev dependencies, then keep only production ones.
FROM node:24.21.0-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json ./
RUN npm ci --no-audit --no-fund
COPY src ./src
COPY test ./test
RUN npm run build && npm prune --omit=dev

# Runtime stage: compiled code and production dependencies only, as an unprivileged user.
FROM node:24.21.0-bookworm-slim
ENV NODE_ENV=production
# The bundled demo configuration binds ${PERCH_HOST:-127.0.0.1}; inside a container only
# 0.0.0.0 is reachable through a published port. Mount your own file over /etc/perch/perch.yaml.
ENV PERCH_HOST=0.0.0.0
WORKDIR /app
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist/src ./dist/src
COPY config/perch.yaml /etc/perch/perch.yaml
RUN ln -s /app/dist/src/main.js /usr/local/bin/perch && chmod +x /app/dist/src/main.js
USER node
EXPOSE 8080
# Liveness through the same listener clients use; override the URL when the port or scheme differ.
ENV PERCH_HEALTH_URL=http://127.0.0.1:8080/healthz
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["node", "-e", "fetch(process.env.PERCH_HEALTH_URL).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
ENTRYPOINT ["perch"]
CMD ["--config", "/etc/perch/perch.yaml"]
