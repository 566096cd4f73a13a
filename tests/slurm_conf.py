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
