"""Posts each conversation to a running upstream llama-server's /apply-template and writes the
golden file for one template (called by record-template-goldens.sh)."""

import json
import sys
import time
import urllib.error
import urllib.request

import gguf


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def main():
    name, base, model, conversations, out = sys.argv[1:6]
    reader = gguf.GGUFReader(model)

    def flag(key, default):
        field = reader.get_field(key)
        return bool(field.contents()) if field is not None else default

    with urllib.request.urlopen(base + "/props", timeout=30) as resp:
        props = json.loads(resp.read())
    golden = {
        "template": name,
        "bos_token": props.get("bos_token", ""),
        "eos_token": props.get("eos_token", ""),
        "add_bos": flag("tokenizer.ggml.add_bos_token", True),
        "add_eos": flag("tokenizer.ggml.add_eos_token", False),
        "now": int(time.time()),
        "cases": [],
    }
    for conv in json.load(open(conversations)):
        status, reply = post(base + "/apply-template", conv["body"])
        case = {"name": conv["name"], "body": conv["body"]}
        if status == 200 and "prompt" in reply:
            case["prompt"] = reply["prompt"]
        else:
            case["error"] = reply.get("error", {}).get("message", f"HTTP {status}")
        golden["cases"].append(case)
    with open(out, "w") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")
    ok = sum(1 for c in golden["cases"] if "prompt" in c)
    print(f"{name}: {ok}/{len(golden['cases'])} rendered")


if __name__ == "__main__":
    main()
