"""The slurm.conf of the tests' own Slurm clusters (one machine, or several hosts as network
namespaces): daemons as root, no munge, no cgroups, every file in one directory."""

from __future__ import annotations

from pathlib import Path

SLURM_CONF = """
ClusterName=tokenmilltest
SlurmctldHost={controller}
{ports}
# Test cluster only: no munge daemon to manage.
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
# No cgroups in a container: plain process tracking, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=1
KillWait=5
MinJobAge=600
{nodes}
PartitionName=debug Nodes={partition} Default=YES MaxTime=INFINITE State=UP
"""


def write_slurm_conf(directory: Path, controller: str, nodes: dict[str, str], ports: str = "") -> Path:
    """``directory``/slurm.conf for a slurmctld at ``controller`` (``NAME(ADDRESS)``) and one
    node of 2 CPUs per name -> address in ``nodes``, with the state and spool directories the
    daemons expect; ``ports``: the daemons' port lines, where the defaults would collide."""
    (directory / "state").mkdir(exist_ok=True)
    for name in nodes:
        (directory / f"spool-{name}").mkdir(exist_ok=True)
    lines = [
        f"NodeName={name} NodeAddr={address} CPUs=2 RealMemory=1000 State=UNKNOWN" for name, address in nodes.items()
    ]
    text = SLURM_CONF.format(
        controller=controller, ports=ports, dir=directory, nodes="\n".join(lines), partition=",".join(nodes)
    )
    conf = directory / "slurm.conf"
    conf.write_text(text.lstrip())
    return conf


# The states in which a job has ended.
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}

# A recipe small enough to run as a Slurm job on one or two nodes in a test.
RECIPE = """
name: slurmtiny
sources:
  - name: wiki
    path: {corpus}/wikitext2_valid.txt
    format: text
    separator: '^(?= = [^=])'
curate:
  - stage: normalize
  - stage: dedup
    options: {{method: exact}}
tokenize: {{vocab_size: 320}}
blend:
  - {{source: wiki, weight: 1.0}}
train:
  config:
    model: {{preset: tiny, max_seq_len: 32}}
    dataset: {{seq_len: 32, split: "90,10,0"}}
    schedule: {{steps: 12, global_batch_size: 4, warmup_steps: 2}}
    optimizer: {{lr: 3.0e-3}}
    parallel: {{precision: fp32}}
    checkpoint: {{interval: 2}}
    logging: {{interval: 1, eval_interval: 6, eval_iters: 1, tensorboard: false}}
"""


def losses(run_dir: Path) -> dict[int, float]:
    from tokenmill.train.metrics import read_metrics

    return {m["step"]: m["loss"] for m in read_metrics(run_dir) if "loss" in m}
