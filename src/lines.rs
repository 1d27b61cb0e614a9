//! Splitting a stream of output chunks into lines (a chunk may end mid-line), for the
//! turn's driver and for `logs -f` alike.

/// Splits a byte stream into lines.
#[derive(Debug, Default)]
pub struct LineBuffer {
    pending: Vec<u8>,
}

impl LineBuffer {
    pub fn feed(&mut self, bytes: &[u8], mut on_line: impl FnMut(&str)) {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(pos);
            if self.pending.is_empty() {
                on_line(&String::from_utf8_lossy(head));
            } else {
                self.pending.extend_from_slice(head);
                on_line(&String::from_utf8_lossy(&self.pending));
                self.pending.clear();
            }
            rest = &tail[1..];
        }
        self.pending.extend_from_slice(rest);
    }

    pub fn finish(&mut self, on_line: impl FnOnce(&str)) {
        if !self.pending.is_empty() {
            on_line(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_come_out_whole() {
        let mut lines = LineBuffer::default();
        let mut out = Vec::new();
        for chunk in [&b"one\ntw"[..], b"o\n", b"", b"thr", b"ee"] {
            lines.feed(chunk, |l| out.push(l.to_string()));
        }
        lines.finish(|l| out.push(l.to_string()));
        assert_eq!(out, ["one", "two", "three"]);
    }
}
