import time, json, resource
from tests.api.test_transcripts import import_file, user, assistant, tool_use, tool_result, chain

def big_file(n):
    parts = []; parent = None
    for i in range(n):
        uid = f"u{i}"
        if i % 3 == 0: line = user(uid, parent, "x" * 300 + str(i))
        elif i % 3 == 1: line = assistant(uid, parent, f"m{i}", {"type":"text","text":"y"*200}, ) ; line["message"]["content"].append(tool_use(f"t{i}"))
        else: line = user(uid, parent, tool_result(f"t{i-1}"))
        parts.append(json.dumps(line)); parent = uid
    return ("\n".join(parts) + "\n").encode()

async def chunks(b):
    for i in range(0, len(b), 65536): yield b[i:i+65536]

async def test_scale(api):
    body = big_file(150_000)
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    r = await import_file(api, chunks(body))
    t1 = time.perf_counter()
    assert r.status_code == 201, r.text
    r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\n{len(body)/1e6:.0f} MB, 150k lines: {t1-t0:.1f} s, peak RSS +{(r1-r0)/1024:.0f} MB (body itself {len(body)/2**20:.0f} MiB held by the test)")
