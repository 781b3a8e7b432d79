//! `--data-parallel-size N`: N engine cores behind one API server, as vLLM's
//! internal data parallelism runs N engine-core processes behind its frontend.
//!
//! Each rank is a whole engine (its model copy, KV cache and scheduler) on its own
//! thread, with step threads pinned to its own CPUs: one NUMA node each when the
//! machine has at least N nodes (so a rank's weights and KV cache stay in its
//! node's memory), otherwise an even split of the CPUs this process may use. The
//! engine handle sends each request to the least loaded rank; every rank publishes
//! its own KV-cache events, on the configured ports plus its rank (vLLM's
//! `offset_endpoint_port`), with its `dp_rank` in each batch.

use crate::args::ServeArgs;
use crate::serve::kv_events::{KvEventPublisher, KvEventsConfig};
use anyhow::{bail, Context};
use pagoda_engine::{EngineConfig, EngineHandle, KvEventSink, LLMEngine};

/// Builds and starts every rank (one without data parallel: unpinned, as before).
pub fn start_engines(
    args: &ServeArgs,
    config: EngineConfig,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<EngineHandle> {
    let n = args.data_parallel_size as usize;
    let cpu_sets = if n > 1 {
        let sets = cpu_sets(n, &allowed_cpus()?, &numa_nodes())?;
        for (rank, cpus) in sets.iter().enumerate() {
            tracing::info!("data-parallel rank {rank}: CPUs {cpus:?}");
        }
        sets.into_iter().map(Some).collect()
    } else {
        vec![None]
    };
    let mut engines = Vec::with_capacity(n);
    for (rank, cpus) in cpu_sets.into_iter().enumerate() {
        let mut c = config.clone();
        c.cpu_set = cpus;
        if rank == 0 {
            tracing::info!("loading model {}", c.model_path.display());
        }
        let engine = LLMEngine::new(c).with_context(|| format!("starting engine core {rank}"))?;
        // The publisher binds before its engine starts: a taken port is a start-up
        // error, and no event of the first step is lost.
        let sink: Option<KvEventSink> =
            match args.kv_events_config.as_ref().filter(|c| c.publishes()) {
                Some(kv) => {
                    let kv = for_rank(kv, rank)?;
                    let rank32 = u32::try_from(rank).unwrap_or(u32::MAX);
                    Some(runtime.block_on(KvEventPublisher::start(&kv, rank32))?.sink)
                }
                None => None,
            };
        engines.push((engine, sink));
    }
    Ok(EngineHandle::start_ranks(
        engines,
        args.max_waiting_requests,
    ))
}

/// Rank `rank`'s KV-event endpoints: the configured ports plus the rank.
fn for_rank(c: &KvEventsConfig, rank: usize) -> anyhow::Result<KvEventsConfig> {
    let mut c = c.clone();
    c.endpoint = offset_port(&c.endpoint, rank)?;
    c.replay_endpoint = c
        .replay_endpoint
        .as_deref()
        .map(|e| offset_port(e, rank))
        .transpose()?;
    Ok(c)
}

/// `tcp://host:5557` for rank 2 is `tcp://host:5559`.
pub fn offset_port(endpoint: &str, rank: usize) -> anyhow::Result<String> {
    if rank == 0 {
        return Ok(endpoint.to_string());
    }
    let Some((base, port)) = endpoint.rsplit_once(':') else {
        bail!("KV-event endpoint {endpoint} has no port to offset for data-parallel rank {rank}");
    };
    let port: u16 = port
        .parse()
        .with_context(|| format!("the port of KV-event endpoint {endpoint}"))?;
    let Some(p) = port.checked_add(rank as u16).filter(|_| rank < 65536) else {
        bail!("KV-event endpoint {endpoint}: port {port} + rank {rank} is past 65535");
    };
    Ok(format!("{base}:{p}"))
}

/// The CPUs this process may run on (its affinity mask), ascending.
fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    // SAFETY: `set` is zero-initialised and only written by sched_getaffinity.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            bail!(
                "reading the CPU affinity: {}",
                std::io::Error::last_os_error()
            );
        }
        set
    };
    // SAFETY: CPU_ISSET reads the set above within its fixed size.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// The CPUs of each NUMA node (`/sys/devices/system/node/node*/cpulist`); empty
/// when the kernel does not say.
fn numa_nodes() -> Vec<Vec<usize>> {
    let mut nodes = Vec::new();
    for i in 0.. {
        let path = format!("/sys/devices/system/node/node{i}/cpulist");
        let Ok(text) = std::fs::read_to_string(&path) else {
            break;
        };
        nodes.push(parse_cpulist(text.trim()).unwrap_or_default());
    }
    nodes
}

/// A kernel CPU list (`0-3,8,10-11`).
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// `n` disjoint, non-empty CPU sets out of `allowed`: the nodes' allowed CPUs when
/// there are at least `n` nodes with some (ranks spread over whole nodes), else
/// `allowed` cut into `n` contiguous runs that differ in size by at most one.
pub fn cpu_sets(
    n: usize,
    allowed: &[usize],
    nodes: &[Vec<usize>],
) -> anyhow::Result<Vec<Vec<usize>>> {
    if allowed.len() < n {
        bail!(
            "--data-parallel-size {n} needs at least {n} CPUs, one per engine core; \
             this process may use {}",
            allowed.len()
        );
    }
    let usable: Vec<Vec<usize>> = nodes
        .iter()
        .map(|node| {
            node.iter()
                .copied()
                .filter(|c| allowed.contains(c))
                .collect::<Vec<_>>()
        })
        .filter(|cpus| !cpus.is_empty())
        .collect();
    if usable.len() >= n {
        // Whole nodes, dealt round-robin so every rank gets as many as any other.
        let mut sets = vec![Vec::new(); n];
        for (i, node) in usable.into_iter().enumerate() {
            sets[i % n].extend(node);
        }
        return Ok(sets);
    }
    let (each, extra) = (allowed.len() / n, allowed.len() % n);
    let mut rest = allowed;
    Ok((0..n)
        .map(|r| {
            let (a, b) = rest.split_at(each + usize::from(r < extra));
            rest = b;
            a.to_vec()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cpulists_parse() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn ports_offset_by_rank() {
        assert_eq!(offset_port("tcp://*:5557", 0).unwrap(), "tcp://*:5557");
        assert_eq!(offset_port("tcp://*:5557", 2).unwrap(), "tcp://*:5559");
        assert!(offset_port("tcp://*:65535", 1).is_err());
    }

    #[test]
    fn nodes_are_used_whole_when_there_are_enough() {
        let nodes = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(
            cpu_sets(2, &all, &nodes).unwrap(),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        // One node: an even split of the allowed CPUs.
        assert_eq!(
            cpu_sets(2, &[0, 1, 2], &[vec![0, 1, 2]]).unwrap(),
            vec![vec![0, 1], vec![2]]
        );
        let e = cpu_sets(3, &[0, 1], &[]).unwrap_err().to_string();
        assert!(e.contains("at least 3 CPUs"), "{e}");
    }

    proptest! {
        /// Whatever the machine: n disjoint non-empty sets of allowed CPUs, all of
        /// them used, sizes within one of each other when split.
        #[test]
        fn cpu_sets_partition_the_allowed_cpus(
            n in 1usize..6,
            allowed in proptest::collection::btree_set(0usize..64, 1..40),
            node_size in 1usize..16,
        ) {
            let allowed: Vec<usize> = allowed.into_iter().collect();
            let nodes: Vec<Vec<usize>> = (0..64usize)
                .collect::<Vec<_>>()
                .chunks(node_size)
                .map(|c| c.to_vec())
                .collect();
            match cpu_sets(n, &allowed, &nodes) {
                Err(_) => prop_assert!(allowed.len() < n),
                Ok(sets) => {
                    prop_assert_eq!(sets.len(), n);
                    let mut all: Vec<usize> = sets.iter().flatten().copied().collect();
                    all.sort_unstable();
                    prop_assert_eq!(&all, &allowed);
                    prop_assert!(sets.iter().all(|s| !s.is_empty()));
                }
            }
        }
    }
}
