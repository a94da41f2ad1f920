"""The check record both Python client programs share (as checks.js for the Node ones)."""

failures = []


def check(label, ok, detail=""):
    """Records and prints one check."""
    if ok:
        print(f"ok   {label}", flush=True)
    else:
        failures.append(label)
        print(f"FAIL {label}{': ' + detail if detail else ''}", flush=True)
