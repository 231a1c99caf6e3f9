//! Noticing a client that has gone while its non-streamed answer is computed. A streamed answer
//! finds out when a write fails; a whole answer writes nothing until it is done, so the server
//! keeps a duplicate of each connection's socket and asks it, as upstream does, whether the peer
//! has closed its end (a read would return end of file). The task is then dropped and its slot
//! freed.

use std::any::Any;
use std::mem::MaybeUninit;

use socket2::{SockRef, Socket};

/// A duplicate of one connection's socket (its own descriptor, closed when the connection's
/// data drops).
pub struct Peer(Socket);

impl Peer {
    /// For `HttpServer::on_connect`: the connection's stream, TCP or UNIX.
    pub fn of(conn: &dyn Any) -> Option<Peer> {
        if let Some(s) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
            return SockRef::from(s).try_clone().ok().map(Peer);
        }
        #[cfg(unix)]
        if let Some(s) = conn.downcast_ref::<actix_web::rt::net::UnixStream>() {
            return SockRef::from(s).try_clone().ok().map(Peer);
        }
        None
    }

    /// Whether the client has closed its end of the connection (or it failed). Never waits: the
    /// server's sockets are non-blocking, and so is this duplicate of one.
    pub fn gone(&self) -> bool {
        let mut byte = [MaybeUninit::<u8>::uninit(); 1];
        match self.0.peek(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_closed_peer_is_gone_and_an_open_one_is_not() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = l.local_addr().expect("addr");
            let mut client = std::net::TcpStream::connect(addr).expect("connect");
            let (server_side, _) = l.accept().await.expect("accept");
            let peer = Peer::of(&server_side as &dyn Any).expect("a TCP stream");
            assert!(!peer.gone(), "open, nothing sent");
            client.write_all(b"x").expect("write");
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!peer.gone(), "open, bytes waiting");
            drop(client);
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!peer.gone(), "the unread byte comes before the end of file");
            let mut buf = [0u8; 1];
            server_side.try_read(&mut buf).expect("read the byte");
            assert!(peer.gone(), "closed");
            assert!(Peer::of(&3u32 as &dyn Any).is_none());
        });
    }
}
