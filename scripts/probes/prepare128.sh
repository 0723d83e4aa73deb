# Sourced by the time-to-result probes (default_rows.sh, fused_residual.sh) on the device machine, from the repository
# root with R, W (work folder) and O ($OUT) set: the carried nibabel wheel on PYTHONPATH, the machine in $O/env.txt,
# bytecode compiled once, then in $W four 128³ phantoms, a 2-step bf16 checkpoint and folders of 1, 8 and 100 masks.
# The device image sets PYTHONDONTWRITEBYTECODE and ships no .pyc: without bytecode kept in a prefix every process
# compiles torch's sources anew (3–4 s of each timed process; scripts/time_to_result.sh says the same).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$W/pycache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=$R:/tmp/site
{ nvidia-smi -L; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton,sys;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, sys.version.split()[0])"
  git -C $R log -1 --format=%h 2>/dev/null; } > $O/env.txt 2>&1
python3 -c "import medddpm.cli, medddpm.sample.sampler, medddpm.net.kernels, torch._dynamo, torch._inductor, triton"  # bytecode once
cd $W
P=$W/ph; python3 -m medddpm phantom --out $P --n 4 --size 128 >/dev/null
python3 -m medddpm train --images $P/images --masks $P/masks --config bf16 --steps 2 --size 128 --quiet --out $W/ckpt >/dev/null || exit 1
for n in 1 8 100; do d=$W/masks$n; mkdir -p $d; for i in $(seq 0 $((n - 1))); do cp $P/masks/phantom_00$((i % 4)).nii.gz $d/m$(printf %03d $i).nii.gz; done; done
echo "prepared at $SECONDS s"
