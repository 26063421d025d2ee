//! A rank speaking the wire protocol by hand (a zombie, a second trainer, an old client, a
//! malformed request), to see the daemon's replies unfiltered.

use dsprep_client::protocol::{ReplyHeader, Request, Status};

pub struct RawRank {
    _context: zmq::Context,
    pub socket: zmq::Socket,
}

impl RawRank {
    pub fn connect(endpoint: &str) -> RawRank {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::DEALER).unwrap();
        socket.set_rcvtimeo(10_000).unwrap();
        socket.connect(endpoint).unwrap();
        RawRank {
            _context: context,
            socket,
        }
    }

    /// Send `frames` as one message; the reply's header and message (empty for an ok reply).
    pub fn ask_frames(&self, frames: &[&[u8]]) -> (ReplyHeader, String) {
        self.socket.send_multipart(frames, 0).unwrap();
        let reply = self.socket.recv_multipart(0).expect("the daemon replies");
        let header = ReplyHeader::decode(&reply[0]).unwrap();
        let message = match header.status {
            Status::Ok => String::new(),
            _ => (reply.get(1))
                .map(|m| String::from_utf8_lossy(m).into_owned())
                .unwrap_or_default(),
        };
        (header, message)
    }

    pub fn ask(&self, request: &Request) -> (ReplyHeader, String) {
        self.ask_frames(&[&request.encode()])
    }
}
