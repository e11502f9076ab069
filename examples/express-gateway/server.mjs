// node server.mjs: the gateway on PORT (8000), Redis at GATEWAY_REDIS_URL.

import Redis from "ioredis";
import { createApp } from "./app.mjs";
import { settingsFromEnv } from "./config.mjs";

const settings = settingsFromEnv();
const redis = settings.clusterMode ? new Redis.Cluster([settings.redisUrl]) : new Redis(settings.redisUrl);
redis.on("error", (e) => console.error(`redis: ${e.message}`));
const port = Number(process.env.PORT ?? 8000);
createApp(settings, { redis }).listen(port, () => console.log(`gateway on http://127.0.0.1:${port}`));
