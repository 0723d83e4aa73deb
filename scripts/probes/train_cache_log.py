"""python scripts/probes/train_cache_log.py <medddpm args>: the command, with AOT autograd's and Inductor's
cache logs and the compile counters printed to stderr at exit (issue 48: why a warm `train` traced and
partitioned its graph again; ``data/results/<gpu>/time_to_result/train-cache-warm.txt``)."""
import atexit
import logging
import runpy
import sys

for name in ("torch._functorch._aot_autograd.autograd_cache", "torch._inductor.codecache"):
    lg = logging.getLogger(name)
    lg.setLevel(logging.DEBUG)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("LOG %(name)s %(levelname)s %(message)s"))
    lg.addHandler(h)


def dump():
    from torch._dynamo.utils import counters
    for k in sorted(counters):
        print("COUNTER", k, dict(counters[k]), file=sys.stderr)


atexit.register(dump)
sys.argv = ["medddpm", *sys.argv[1:]]
runpy.run_module("medddpm", run_name="__main__", alter_sys=True)
