"""An OpenAI-compatible upstream for the LiteLLM tests, on a loopback port
the test picks: `python tbllmstub.py PORT`.

The model named in the request says how it answers: "fail" is a 500;
"slow" streams 40 words, one every 0.1 s; anything else answers at once.
Every answer reports its usage (a stream in its last chunk), counted as
one token a word, so a test knows what was used."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

WORDS = 40


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def chat(request: Request) -> Response:
    body = await request.json()
    model = str(body.get("model", ""))
    prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    if model == "fail":
        return JSONResponse({"error": {"message": "upstream failed", "type": "server_error"}}, status_code=500)
    words = ["word"] * (WORDS if model == "slow" else 5)
    base = {"id": "chatcmpl-stub", "created": int(time.time()), "model": model}
    if not body.get("stream"):
        message = {"role": "assistant", "content": " ".join(words)}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse(
            {**base, "object": "chat.completion", "choices": [choice], "usage": usage(prompt, len(words))}
        )

    async def events() -> AsyncIterator[str]:
        for word in words:
            delta = {"index": 0, "delta": {"role": "assistant", "content": word + " "}, "finish_reason": None}
            yield f"data: {json.dumps({**base, 'object': 'chat.completion.chunk', 'choices': [delta]})}\n\n"
            if model == "slow":
                await asyncio.sleep(0.1)
        end = {"index": 0, "delta": {}, "finish_reason": "stop"}
        last = {**base, "object": "chat.completion.chunk", "choices": [end], "usage": usage(prompt, len(words))}
        yield f"data: {json.dumps(last)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


app = Starlette(
    routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/chat/completions", chat, methods=["POST"])]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
