//! Links over HTTP: the body format of `POST /link` ([`framing`]) and the hand-over of its packets to the receive
//! loop, which alone owns the node core ([`link`]). The server that takes the requests comes next.

pub mod framing;
pub mod link;

pub use framing::{Framed, FramingError};
pub use link::{LINK_QUEUE, LinkInbox, LinkQueue, LinkRequest, link_channel};
