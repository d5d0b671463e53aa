//! The sending loop: one thread for every link, wire and webhook outlet of the process (BRIEF.md, "sending loop").
//!
//! It is a tokio current-thread runtime on one thread named `pure-send`: one epoll, one wake, timers. Each outlet
//! is a task that sleeps until it wants to run — its app pushed it (a [`tokio::sync::Notify`], once per turn), its
//! socket is ready, or its deadline (a retransmission, a retry) came — so an idle outlet costs nothing and a busy
//! one never waits for an idle one. Name lookups are asynchronous on the same loop ([`dns`]), so a name that does
//! not resolve, or resolves slowly, delays only its own outlet; none blocks the loop or adds a thread.
//!
//! The loop is driven like mini-redis's server: [`SendingLoop::start`] gives it its identity and resolver settings;
//! outlets are started and stopped by command (the app host does it at start and on a reload); a stop ends every
//! task and the thread. The loop beats its own [`Heartbeat`] every half second from a task of its own, so a stuck
//! loop (a task that blocks it) stops the beat, which the receive loop checks before it feeds systemd's watchdog
//! and `/healthz` reports.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::common::dns;
use crate::common::figures::Heartbeat;
use crate::outlets::{Outlet, Target, link, webhook, wire};
use crate::proto::crypto::Identity;

/// How often the loop beats its heartbeat.
const BEAT_EVERY: Duration = Duration::from_millis(500);

/// What the loop needs to send as this node.
#[derive(Clone)]
pub struct LoopSettings {
    /// The node's own key: links and wires send with it as their sender key.
    pub identity: Identity,
    pub dns: dns::DnsSettings,
}

enum Command {
    Start(Arc<Outlet>, Target),
    Stop(u64),
}

/// A handle that starts and stops outlets on the loop from another thread (a fleet's outbox, which starts an
/// outlet when it takes its lease and stops it when it loses it). Commands after the loop stopped do nothing.
#[derive(Clone)]
pub struct Commander(mpsc::UnboundedSender<Command>);

impl Commander {
    /// As [`SendingLoop::start_outlet`].
    pub fn start_outlet(&self, outlet: Arc<Outlet>, target: Target) {
        let _ = self.0.send(Command::Start(outlet, target));
    }

    /// As [`SendingLoop::stop_outlet`].
    pub fn stop_outlet(&self, id: u64) {
        let _ = self.0.send(Command::Stop(id));
    }
}

/// The running loop: a handle to command it and to stop it.
pub struct SendingLoop {
    commands: mpsc::UnboundedSender<Command>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    pub heartbeat: Arc<Heartbeat>,
}

impl SendingLoop {
    /// Starts the loop's thread. It runs no outlet until told to.
    pub fn start(settings: LoopSettings) -> std::io::Result<Self> {
        let (commands, rx) = mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let heartbeat = Arc::new(Heartbeat::default());
        let beat = heartbeat.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("pure-send".into())
            .spawn(move || runtime.block_on(run(settings, rx, stopped, beat)))?;
        Ok(SendingLoop {
            commands,
            stop: Some(stop),
            thread: Some(thread),
            heartbeat,
        })
    }

    /// Starts sending for `outlet`.
    pub fn start_outlet(&self, outlet: Arc<Outlet>, target: Target) {
        // The loop only goes away with `self`; until then the channel is open.
        let _ = self.commands.send(Command::Start(outlet, target));
    }

    /// Stops the outlet with this id (a reload removed or changed it). What it held is in the store.
    pub fn stop_outlet(&self, id: u64) {
        let _ = self.commands.send(Command::Stop(id));
    }

    /// A handle to start and stop outlets from another thread.
    pub fn commander(&self) -> Commander {
        Commander(self.commands.clone())
    }

    /// Whether the loop has beaten within `stale`.
    pub fn alive(&self, now: Instant, stale: Duration) -> bool {
        crate::ops::metrics::healthy(self.heartbeat.age(now), stale)
    }

    /// Stops every outlet and the thread. Nothing is lost: what was not acknowledged is in the stores.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SendingLoop {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn run(
    settings: LoopSettings,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    heartbeat: Arc<Heartbeat>,
) {
    let resolver = dns::Resolver::new(&settings.dns);
    let mut tasks: HashMap<u64, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut beat = tokio::time::interval(BEAT_EVERY);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            command = commands.recv() => match command {
                Some(Command::Start(outlet, target)) => {
                    let id = outlet.id;
                    let task = match target {
                        Target::Link { to, node_key, far_app } => tokio::spawn(link::run(
                            outlet,
                            link::LinkTarget { to, node_key, far_app },
                            settings.identity.clone(),
                            resolver.clone(),
                        )),
                        Target::Webhook(w) => tokio::spawn(webhook::run(
                            outlet,
                            w,
                            crate::keys::encode_key(settings.identity.public()),
                            resolver.clone(),
                        )),
                        Target::Wire(w) => tokio::spawn(wire::run(
                            outlet,
                            w,
                            settings.identity.clone(),
                            resolver.clone(),
                        )),
                    };
                    if let Some(old) = tasks.insert(id, task) {
                        old.abort();
                    }
                }
                Some(Command::Stop(id)) => {
                    if let Some(task) = tasks.remove(&id) {
                        task.abort();
                    }
                }
                None => break,
            },
            _ = beat.tick() => heartbeat.beat(Instant::now()),
        }
    }
    for (_, task) in tasks {
        task.abort();
    }
}
