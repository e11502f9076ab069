# Builds the module and runs Redis with it loaded on port 6379.
# (Written carefully but not run here: the development machines have no
# Docker engine. See README.md.)
FROM rust:1.87-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev clang \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY core ./core
# A workspace member: cargo reads every member's manifest, even to build
# the module alone.
COPY testkit ./testkit
COPY src ./src
RUN cargo build --release --locked

# The baseline the test suite runs on (Redis 7.0.15).
FROM redis:7.0.15-bookworm
COPY --from=build /src/target/release/libredis_tokenbucket.so /usr/local/lib/redis/modules/libredis_tokenbucket.so
COPY lua/tb.lua /usr/local/share/redis-tokenbucket/tb.lua
EXPOSE 6379
CMD ["redis-server", "--loadmodule", "/usr/local/lib/redis/modules/libredis_tokenbucket.so", "--protected-mode", "no"]
