//! Host facts: what the agent reads about this machine's processes and
//! pods — `/proc` (`procfs`: sockets, TCP tables, process trees, cgroups
//! and containers, network namespaces), engine discovery (`discover`:
//! which processes are inference servers listening on TCP), and the
//! Kubernetes API's pods of this node (`kube`), the node's name (`node`);
//! and the one door into an engine's own files (`rootfs`: resolved inside
//! its root, regular files and directories only, bounded).
//!
//! Owns: reading those facts. Must not: import any stage or feature (it
//! sits on the sources' floor), or hold more than the facts it returns
//! (the pod index is bounded).

pub mod discover;
pub mod kube;
pub mod node;
pub mod procfs;
pub mod rootfs;
