//! A network namespace of the test's own, for cutting one process off the
//! network and reconnecting it: the process runs inside it (`ip netns exec`)
//! and reaches the services through forwarders that listen on the
//! namespace's loopback at the services' own ports (so a Kafka broker's
//! advertised `127.0.0.1:<port>` works there too) and connect to them on the
//! host's loopback. Bringing the namespace's loopback down cuts every
//! connection of the process at once — packets are dropped, nobody is told,
//! as when a machine is cut off — and bringing it up reconnects it.
//!
//! Needs root (as the whole test suite does) and `ip` (iproute2).

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;

/// A network namespace, deleted when dropped.
pub struct Netns {
    name: String,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("running ip (iproute2)");
    assert!(status.success(), "ip {} failed: {status}", args.join(" "));
}

impl Netns {
    /// A new namespace with its loopback up.
    pub fn create(tag: &str) -> Netns {
        let name = format!("exactly-{tag}-{}", std::process::id());
        // One left by an earlier run of this pid, if any.
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        ip(&["netns", "add", &name]);
        let ns = Netns { name };
        ns.reconnect();
        ns
    }

    /// Serves `127.0.0.1:port` inside the namespace from `127.0.0.1:port`
    /// of the host, for as long as the test runs.
    pub fn forward(&self, port: u16) {
        let path = format!("/var/run/netns/{}", self.name);
        let (inbound_tx, inbound_rx) = std::sync::mpsc::channel::<TcpStream>();
        // Dials on the host's network (spawned before any setns).
        std::thread::spawn(move || {
            for inbound in inbound_rx {
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                pipe(&inbound, &upstream);
                pipe(&upstream, &inbound);
            }
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("opening the namespace");
            // SAFETY: setns on a valid namespace descriptor; it changes only
            // this thread's network namespace.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            let listener = TcpListener::bind(("127.0.0.1", port)).expect("listening inside the namespace");
            ready_tx.send(()).unwrap();
            for inbound in listener.incoming().flatten() {
                if inbound_tx.send(inbound).is_err() {
                    return;
                }
            }
        });
        ready_rx.recv().expect("the forwarder started");
    }

    /// Cuts every connection of the processes inside off: the namespace's
    /// loopback goes down.
    pub fn cut(&self) {
        ip(&["-n", &self.name, "link", "set", "lo", "down"]);
    }

    /// Brings the namespace's loopback (back) up.
    pub fn reconnect(&self) {
        ip(&["-n", &self.name, "link", "set", "lo", "up"]);
    }

    /// `ip netns exec <namespace>`, to which the program and its arguments
    /// are added.
    pub fn exec(&self) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]);
        command
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Copies `from` into `to` on a thread of its own until either ends.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}
