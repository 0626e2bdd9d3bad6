//! Tracepoint record layouts, read from the kernel's own description: the
//! tracefs `format` file of every tracepoint a program reads. The programs
//! read their context at constant offsets (the only loads the verifier
//! allows a tracepoint program, and no kernel memory is read), so where a
//! field moved between kernels there is one program per known layout and
//! this module says which one this kernel takes — or that none fits, in
//! which case the feature degrades (said once), never the start.
//!
//! Owns: parsing `format` files and the choices made from them (`Layouts`).
//! Must not: attach anything (that is `probes.rs`).
//!
//! Kernels differ here (fixtures of Debian's 6.1 and 6.12 and of 6.18 in
//! `formats/`, read by the kernel matrix, `cargo xtask kernels`):
//! - `sched_process_exit` gained `bool group_dead` at offset 32 in 6.16;
//!   earlier the group's end is the leader's exit ([`ExitLayout`]);
//! - `sched_process_fork`'s comms became `__data_loc` strings in 6.14 or
//!   so, moving `child_pid` from 44 to 20;
//! - `tcp:tcp_probe` gained `sock_cookie` in 5.6 and `skbaddr`/`skaddr`
//!   after it (the arrival program reads up to `sock_cookie`);
//! - the syscall tracepoints (`args` from 16, `ret` at 16) have not moved,
//!   and are checked all the same.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// One `field:` line of a format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field's name (`child_pid`, `saddr` for `__u8 saddr[28]`).
    pub name: String,
    /// The declaration as the file gives it (`__u8 saddr[28]`).
    pub decl: String,
    pub offset: usize,
    pub size: usize,
}

/// A tracepoint's record layout (its `format` file, parsed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Format {
    /// `name:` of the file (the tracepoint's name).
    pub name: String,
    /// The fields after the common ones, in the file's order.
    pub fields: Vec<Field>,
}

impl Format {
    /// Parses a format file; lines that are not `field:` lines (or that
    /// do not parse) are skipped, and the `common_*` fields left out.
    pub fn parse(text: &str) -> Format {
        let mut f = Format::default();
        for line in text.lines() {
            let line = line.trim();
            if let Some(n) = line.strip_prefix("name:") {
                f.name = n.trim().to_string();
                continue;
            }
            let Some(rest) = line.strip_prefix("field:") else {
                continue;
            };
            let mut parts = rest.split(';').map(str::trim);
            let Some(decl) = parts.next() else { continue };
            let (mut offset, mut size) = (None, None);
            for p in parts {
                if let Some(v) = p.strip_prefix("offset:") {
                    offset = v.trim().parse().ok();
                } else if let Some(v) = p.strip_prefix("size:") {
                    size = v.trim().parse().ok();
                }
            }
            let (Some(offset), Some(size)) = (offset, size) else {
                continue;
            };
            let last = decl.rsplit([' ', '*']).next().unwrap_or(decl);
            let name = last.split('[').next().unwrap_or(last).to_string();
            if name.is_empty() || name.starts_with("common_") {
                continue;
            }
            f.fields.push(Field {
                name,
                decl: decl.to_string(),
                offset,
                size,
            });
        }
        f
    }

    /// Reads `events/CATEGORY/NAME/format` under tracefs.
    pub fn read(events: &Path, category: &str, name: &str) -> Result<Format> {
        let path = events.join(category).join(name).join("format");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no {category}:{name} tracepoint ({})", path.display()))?;
        Ok(Format::parse(&text))
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Fails unless `name` is at `offset` with `size` bytes.
    fn expect(&self, name: &str, offset: usize, size: usize) -> Result<()> {
        let f = self
            .field(name)
            .with_context(|| format!("{} has no field {name}", self.label()))?;
        if f.offset != offset || f.size != size {
            bail!(
                "{}'s {name} is not at offset {offset} (size {size}) on this kernel: {} at {} (size {})",
                self.label(),
                f.decl,
                f.offset,
                f.size
            );
        }
        Ok(())
    }

    fn label(&self) -> &str {
        if self.name.is_empty() {
            "the tracepoint"
        } else {
            &self.name
        }
    }
}

/// How the end of a targeted thread group is seen (`sched_process_exit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitLayout {
    /// `bool group_dead` at offset 32 (Linux 6.16+): the group's last
    /// thread (program `exit_group_dead`).
    GroupDead,
    /// No `group_dead` (or not where the program reads it): the thread
    /// group leader's exit (program `exit_leader`, which reads nothing of
    /// the record, so it fits every kernel).
    Leader,
}

impl ExitLayout {
    pub fn of(f: &Format) -> ExitLayout {
        match f.field("group_dead") {
            Some(g) if g.offset == 32 && g.size == 1 => ExitLayout::GroupDead,
            _ => ExitLayout::Leader,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExitLayout::GroupDead => "group_dead",
            ExitLayout::Leader => "leader",
        }
    }
}

/// `sched_process_fork`'s `child_pid` offset.
pub fn fork_child_pid(f: &Format) -> Option<usize> {
    f.field("child_pid")
        .filter(|c| c.size == 4)
        .map(|c| c.offset)
}

/// Checks a `tcp:tcp_probe` layout against the offsets the arrival
/// program reads (`agent_ebpf::arrival_tp`).
pub fn arrival_matches(f: &Format) -> Result<()> {
    for (field, offset, size) in agent_ebpf::arrival_tp::FIELDS {
        f.expect(field, offset, size)?;
    }
    Ok(())
}

/// Offset of a syscall's first argument in `sys_enter_*` records and of
/// `ret` in `sys_exit_*` records, as `agent-ebpf/src/ctx.rs` reads them.
pub const SYSCALL_ARGS_OFFSET: usize = agent_ebpf::SYSCALL_ARGS_OFFSET;

/// Checks a syscall tracepoint's layout against what the programs read:
/// `sys_enter_*` arguments as 8-byte words from offset 16, `sys_exit_*`'s
/// `ret` at 16.
pub fn syscall_matches(f: &Format) -> Result<()> {
    if f.name.starts_with("sys_exit_") {
        return f.expect("ret", SYSCALL_ARGS_OFFSET, 8);
    }
    let args = f.fields.iter().filter(|x| x.name != "__syscall_nr");
    for (i, a) in args.enumerate() {
        f.expect(&a.name, SYSCALL_ARGS_OFFSET + 8 * i, 8)?;
    }
    Ok(())
}

/// What this kernel's layouts select, read once at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layouts {
    pub exit: ExitLayout,
    /// `None`: no fork program fits; children of targets are not followed
    /// in the kernel.
    pub fork_child_pid: Option<usize>,
}

impl Layouts {
    /// From tracefs's `events` directory. A format that cannot be read
    /// takes the choice that reads nothing of it (the leader's exit) or
    /// none (no fork program).
    pub fn read(events: &Path) -> Layouts {
        let exit = Format::read(events, "sched", "sched_process_exit")
            .map(|f| ExitLayout::of(&f))
            .unwrap_or(ExitLayout::Leader);
        let fork_child_pid = Format::read(events, "sched", "sched_process_fork")
            .ok()
            .and_then(|f| fork_child_pid(&f));
        Layouts {
            exit,
            fork_child_pid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format files of every tracepoint the agent attaches, as three
    /// kernels give them (`@@ CATEGORY/NAME` before each file).
    const KERNELS: [(&str, &str); 3] = [
        ("6.1", include_str!("formats/linux-6.1.txt")),
        ("6.12", include_str!("formats/linux-6.12.txt")),
        ("6.18", include_str!("formats/linux-6.18.txt")),
    ];

    fn formats(text: &str) -> Vec<(String, Format)> {
        text.split("\n@@ ")
            .skip(1)
            .filter_map(|part| {
                let (id, body) = part.split_once('\n')?;
                (id != "END").then(|| (id.trim().to_string(), Format::parse(body)))
            })
            .collect()
    }

    fn format(kernel: &str, id: &str) -> Format {
        let text = KERNELS.iter().find(|(k, _)| *k == kernel).unwrap().1;
        formats(text)
            .into_iter()
            .find(|(i, _)| i == id)
            .unwrap_or_else(|| panic!("{kernel}: no {id} in the fixture"))
            .1
    }

    #[test]
    fn fields_are_named_without_types_arrays_or_pointers() {
        let f = format("6.18", "tcp/tcp_probe");
        assert_eq!(f.name, "tcp_probe");
        let daddr = f.field("daddr").unwrap();
        assert_eq!((daddr.offset, daddr.size), (36, 28));
        assert_eq!(daddr.decl, "__u8 daddr[28]");
        assert_eq!(f.field("skaddr").unwrap().offset, 128);
        assert!(f.field("common_pid").is_none());
        let fork = format("6.18", "sched/sched_process_fork");
        assert_eq!(fork.field("parent_comm").unwrap().size, 4);
        assert_eq!(
            Format::parse("garbage\nfield:int x;\toffset:z;"),
            Format::default()
        );
    }

    #[test]
    fn the_exit_program_follows_group_dead_where_the_kernel_has_it() {
        let want = [
            ("6.1", ExitLayout::Leader),
            ("6.12", ExitLayout::Leader),
            ("6.18", ExitLayout::GroupDead),
        ];
        for (k, layout) in want {
            assert_eq!(
                ExitLayout::of(&format(k, "sched/sched_process_exit")),
                layout,
                "{k}"
            );
        }
        // group_dead somewhere the program does not read: the leader.
        let moved =
            Format::parse("name: x\n\tfield:bool group_dead;\toffset:36;\tsize:1;\tsigned:0;");
        assert_eq!(ExitLayout::of(&moved), ExitLayout::Leader);
    }

    #[test]
    fn the_fork_variant_is_the_child_pid_offset_each_kernel_gives() {
        for (k, at) in [("6.1", 44), ("6.12", 44), ("6.18", 20)] {
            assert_eq!(
                fork_child_pid(&format(k, "sched/sched_process_fork")),
                Some(at),
                "{k}"
            );
        }
        assert_eq!(fork_child_pid(&Format::default()), None);
    }

    #[test]
    fn arrival_and_every_syscall_layout_check_out_on_the_three_kernels() {
        for (k, text) in KERNELS {
            let all = formats(text);
            assert!(all.len() >= 36, "{k}: {} formats", all.len());
            for (id, f) in &all {
                if id.starts_with("syscalls/") {
                    syscall_matches(f).unwrap_or_else(|e| panic!("{k} {id}: {e:#}"));
                }
            }
            arrival_matches(&format(k, "tcp/tcp_probe")).unwrap();
        }
    }

    #[test]
    fn a_moved_field_is_named_with_where_it_is() {
        let tcp = format("6.18", "tcp/tcp_probe");
        let mut shifted = tcp.clone();
        shifted
            .fields
            .iter_mut()
            .find(|f| f.name == "data_len")
            .unwrap()
            .offset = 72;
        let e = arrival_matches(&shifted).unwrap_err().to_string();
        assert!(
            e.contains("data_len is not at offset 76") && e.contains("at 72"),
            "{e}"
        );
        let mut no_cookie = tcp.clone();
        no_cookie.fields.retain(|f| f.name != "sock_cookie");
        let e = arrival_matches(&no_cookie).unwrap_err().to_string();
        assert!(e.contains("no field sock_cookie"), "{e}");
        let mut read = format("6.1", "syscalls/sys_enter_read");
        read.fields
            .iter_mut()
            .find(|f| f.name == "count")
            .unwrap()
            .offset = 40;
        let e = syscall_matches(&read).unwrap_err().to_string();
        assert!(
            e.contains("sys_enter_read's count is not at offset 32"),
            "{e}"
        );
        let mut ret = format("6.12", "syscalls/sys_exit_write");
        ret.fields.retain(|f| f.name != "ret");
        assert!(syscall_matches(&ret).is_err());
    }
}
