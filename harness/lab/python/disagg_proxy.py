"""The Python P/D proxy baseline of `pinroute-lab bench`.

It does the two hops the way vLLM's example disaggregation proxies do (FastAPI + httpx,
one uvicorn process): read the client's JSON body, send a copy to the prefill worker with
`stream: false`, `max_tokens: 1` and `kv_transfer_params.do_remote_decode: true`, wait for
the answer, put the `kv_transfer_params` it returned into the original body, and stream the
decode worker's answer back chunk by chunk. Written for the comparison, not for production:
no pins, no retries, no typed errors.

    python disagg_proxy.py --listen 127.0.0.1:8000 --prefill 127.0.0.1:8100 --decode 127.0.0.1:8200

uvicorn runs with uvloop and httptools when they are installed (as `fastapi[standard]`,
which vLLM depends on, installs them) and without its access log.
"""

import argparse
import uuid
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

PREFILL_KV_TRANSFER_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Fields a prefill hop must not carry (vLLM's example removes the same ones).
PREFILL_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")


def unbounded_client(address: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=f"http://{address}", timeout=None, limits=limits)


def prefill_body(body: dict) -> dict:
    prefill = {k: v for k, v in body.items() if k not in PREFILL_DROPPED}
    prefill["kv_transfer_params"] = PREFILL_KV_TRANSFER_PARAMS
    prefill["stream"] = False
    prefill["max_tokens"] = 1
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    return prefill


def build_app(prefill_address: str, decode_address: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.prefill = unbounded_client(prefill_address)
        app.state.decode = unbounded_client(decode_address)
        yield
        await app.state.prefill.aclose()
        await app.state.decode.aclose()

    app = FastAPI(lifespan=lifespan)

    async def two_hops(path: str, request: Request) -> StreamingResponse:
        body = await request.json()
        body.pop("kv_transfer_params", None)
        request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        headers = {"X-Request-Id": request_id}
        prefill = await request.app.state.prefill.post(path, json=prefill_body(body), headers=headers)
        prefill.raise_for_status()
        kv_transfer_params = prefill.json().get("kv_transfer_params")
        if kv_transfer_params:
            body["kv_transfer_params"] = kv_transfer_params

        async def decode_stream():
            decode = request.app.state.decode
            async with decode.stream("POST", path, json=body, headers=headers) as response:
                response.raise_for_status()
                async for chunk in response.aiter_bytes():
                    yield chunk

        return StreamingResponse(decode_stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await two_hops("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await two_hops("/v1/chat/completions", request)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    return app


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="ip:port to serve on")
    parser.add_argument("--prefill", required=True, help="ip:port of the prefill worker")
    parser.add_argument("--decode", required=True, help="ip:port of the decode worker")
    args = parser.parse_args()
    host, port = host_port(args.listen)
    app = build_app(args.prefill, args.decode)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
