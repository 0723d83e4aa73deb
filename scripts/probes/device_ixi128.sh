# Sourced by the 128³ probes (plateau128.sh, curriculum128.sh) on the device machine: the environment every process
# needs (NCCL without NVLS, byte-code written, the compile caches kept under $W) and the first call's load.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset PYTHONDONTWRITEBYTECODE
W=/tmp/w; R=$W/repo; RES=$W/res
export PYTHONPYCACHEPREFIX=$W/pycache PYTHONPATH=$R:/tmp/site
export MEDDDPM_CACHE=$W/cache TORCHINDUCTOR_CACHE_DIR=$W/cache/inductor TRITON_CACHE_DIR=$W/cache/triton

stamp() { echo "$1 $(date +%s.%N)" >> $W/times.txt; }

load_ixi128() {  # call 1: nibabel from .carry/whl, half the 128³ images (.carry/d128a), the machine into $W/env.txt
  mkdir -p $W /tmp/d128
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl || return 1
  cp -r .carry/d128a/. /tmp/d128/
  { nvidia-smi -L; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
    python3 -c "import torch,triton,sys;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(), triton.__version__, sys.version.split()[0])"
    git log -1 --format=%H 2>/dev/null; git status --short 2>/dev/null | head; } > $W/env.txt 2>&1
  cat $W/env.txt; ls /tmp/d128/dev/images | wc -l
}

launch() {  # $1: the probe script's name; this tree copied to $R, its pipeline started in its own session (setsid),
  # which outlives the call on a warm machine; $2 "again": the earlier pipeline's stamps kept, its output appended
  rm -rf $R && mkdir -p $R && cp -r medddpm scripts pyproject.toml $R/
  if [ "${2:-}" = again ]; then sed -i 's/^DONE /DONE-before /' $W/times.txt; else rm -f $W/times.txt $W/pipeline.txt; fi
  setsid nohup bash $R/scripts/probes/$1 pipeline >> $W/pipeline.txt 2>&1 < /dev/null &
}
