"""DDP502 late-cuda-visible-devices: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = "import os\nimport torch\nimport torch.distributed as dist\n"


def test_message_names_the_initialising_call_and_its_line():
    src = HEAD + 'torch.cuda.set_device(0)\nos.environ["CUDA_VISIBLE_DEVICES"] = "1"\n'
    (f,) = findings("DDP502", src)
    assert f.line == 5 and f.severity.name == "WARNING"
    assert "`torch.cuda.set_device(...)` (line 4)" in f.message
    assert "before `import torch`" in f.fix and "CUDA_VISIBLE_DEVICES=0,1 torchrun" in f.fix


def test_which_calls_initialise_cuda():
    initialising = [
        "torch.cuda.is_available()", "torch.cuda.current_device()", "torch.cuda.get_device_name(0)",
        "torch.cuda.synchronize()", "x = torch.zeros(3).cuda()", 'x = torch.zeros(3, device="cuda:0")',
        "x = t.to(torch.device('cuda', 1))", "if torch.cuda.is_available():\n    pass",
    ]
    for call in initialising:
        src = HEAD + call + '\nos.environ["CUDA_VISIBLE_DEVICES"] = "1"\n'
        assert lines("DDP502", src) != [], call
    quiet = [
        "torch.cuda.device_count()", "torch.cuda.manual_seed_all(0)", "torch.cuda.manual_seed(0)",
        'device = torch.device("cuda")', "x = t.to(args.device)", "x = t.to(torch.float16)",
        "torch.cuda.is_initialized()",
    ]
    for call in quiet:
        src = HEAD + call + '\nos.environ["CUDA_VISIBLE_DEVICES"] = "1"\n'
        assert lines("DDP502", src) == [], call


def test_every_way_of_setting_it():
    src = HEAD + """\
torch.cuda.init()
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
os.environ.update(CUDA_VISIBLE_DEVICES="0")
os.putenv("CUDA_VISIBLE_DEVICES", "0")
os.environ["OMP_NUM_THREADS"] = "4"
"""
    assert lines("DDP502", src) == [5, 6, 7]


def test_the_caller_initialised_cuda_first():
    src = HEAD + """\
def pick_gpus(ids):
    os.environ["CUDA_VISIBLE_DEVICES"] = ids

print(torch.cuda.is_available())
pick_gpus("0,1")
train()
"""
    assert lines("DDP502", src) == [5]


def test_a_write_for_child_processes_takes_effect():
    src = HEAD + """\
import subprocess

def pick_gpus(ids):
    os.environ["CUDA_VISIBLE_DEVICES"] = ids

def worker(rank):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)

def launch_eval(gpu):
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    subprocess.run(["python", "eval.py"], check=True)

print(torch.cuda.is_available())
pick_gpus("0,1")
torch.multiprocessing.spawn(worker, nprocs=2)
launch_eval("3")
"""
    # pick_gpus runs before mp.spawn, launch_eval before subprocess.run: the children read it;
    # worker runs in a fresh process where the parent's CUDA does not count
    assert lines("DDP502", src) == []


def test_other_arm_of_the_if():
    src = HEAD + """\
if args.cpu_only:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
else:
    model = model.cuda()
"""
    assert lines("DDP502", src) == []
