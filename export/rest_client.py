"""Query a keras-preact model on TF Serving's REST API (port 8501). Standard library + numpy +
Pillow only: no TensorFlow needed on the client.

    python export/rest_client.py IMAGE.jpg [--model preact-20] [--host http://127.0.0.1:8501]
        [--mode uint8|bytes|classify]

uint8    POST /v1/models/NAME:predict   serving_default, pixels as JSON integers
bytes    POST /v1/models/NAME:predict   serving_bytes, the file's bytes as {"b64": ...}
classify POST /v1/models/NAME:classify  classify, a tf.Example {"image/encoded": {"b64": ...}}
"""

from __future__ import annotations

import argparse
import base64
import json
import urllib.error
import urllib.request

import numpy as np


def uint8_payload(pixels: np.ndarray) -> dict:
    """serving_default: `pixels` uint8 (batch, height, width, 3), row ("instances") format."""
    return {"signature_name": "serving_default", "instances": pixels.astype(np.uint8).tolist()}


def bytes_payload(encoded: list[bytes]) -> dict:
    """serving_bytes: encoded JPEG/PNG files, base64 in {"b64": ...} as TF Serving's JSON wants."""
    return {
        "signature_name": "serving_bytes",
        "instances": [{"b64": base64.b64encode(data).decode()} for data in encoded],
    }


def classify_payload(encoded: list[bytes]) -> dict:
    """classify (Classify API): one tf.Example per image with an `image/encoded` bytes feature."""
    return {
        "signature_name": "classify",
        "examples": [{"image/encoded": {"b64": base64.b64encode(d).decode()}} for d in encoded],
    }


def post(url: str, payload: dict, timeout: float = 30.0) -> dict:
    request = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def failure(url: str, error: OSError) -> str:
    """One line for what went wrong talking to `url`: TF Serving's own {"error": ...} for an
    HTTP error (an unknown model, a bad request), else the reason the server is unreachable."""
    if isinstance(error, urllib.error.HTTPError):
        try:
            detail = json.load(error).get("error", "")
        except (ValueError, AttributeError):
            detail = ""
        return f"{url}: HTTP {error.code} {error.reason}" + (f": {detail}" if detail else "")
    reason = getattr(error, "reason", error)
    return (f"no TF Serving at {url} ({reason}): start it (export/README.md, step 0) or "
            "pass --host")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image")
    parser.add_argument("--model", default="preact-20")
    parser.add_argument("--host", default="http://127.0.0.1:8501")
    parser.add_argument("--mode", choices=("uint8", "bytes", "classify"), default="bytes")
    args = parser.parse_args()

    try:
        with open(args.image, "rb") as f:
            data = f.read()
    except OSError as error:
        parser.error(f"cannot read image {args.image!r}: {error.strerror}")
    if args.mode == "uint8":
        from PIL import Image

        pixels = np.asarray(Image.open(args.image).convert("RGB"))[None]
        payload = uint8_payload(pixels)
    else:
        payload = (bytes_payload if args.mode == "bytes" else classify_payload)([data])
    verb = "classify" if args.mode == "classify" else "predict"
    url = f"{args.host}/v1/models/{args.model}:{verb}"
    try:
        answer = post(url, payload)
    except OSError as error:  # URLError, HTTPError, a timeout
        parser.exit(1, f"{parser.prog}: error: {failure(url, error)}\n")
    if verb == "classify":  # {"results": [[[label, score], ...]]}
        for label, score in answer["results"][0]:
            print(f"{score:.4f}  {label}")
    else:  # {"predictions": [{"labels": [...], "scores": [...], ...}]}
        top = answer["predictions"][0]
        for label, score in zip(top["labels"], top["scores"]):
            print(f"{score:.4f}  {label}")


if __name__ == "__main__":
    main()
