//! Opening an input file: compression is recognised by content (magic bytes), never by name.
//!
//! Decompression runs on its own thread and hands the parser large blocks of text through a
//! bounded channel, so inflating and parsing overlap. Blocks are recycled, so a load allocates a
//! handful of buffers whatever the file size.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::error::LoadError;

/// How the bytes of a file are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Plain,
    Gzip,
    /// Zstandard (heaptrack's data files; one or more frames).
    Zstd,
}

impl Compression {
    /// Name used in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Gzip => "gzip",
            Self::Zstd => "zstd",
        }
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Size of the blocks of decompressed text handed to the parser. Large enough that channel
/// traffic is negligible, small enough to stay in L2/L3 while it is parsed.
const BLOCK_BYTES: usize = 512 << 10;
/// Blocks in flight between the inflate thread and the parser.
const BLOCKS_IN_FLIGHT: usize = 2;

/// How a stream of decompressed text ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The whole file was read.
    Complete,
    /// The compressed stream stopped early; everything before that point was delivered.
    Truncated(String),
}

/// A message from the inflate thread.
enum Chunk {
    Data(Vec<u8>),
    End(StreamEnd),
    Failed(io::Error),
}

/// Decompressed text of a file, delivered in blocks from a background thread.
pub struct TextStream {
    path: PathBuf,
    compression: Compression,
    file_bytes: u64,
    compressed_read: Arc<AtomicU64>,
    rx: Option<Receiver<Chunk>>,
    recycle: SyncSender<Vec<u8>>,
    worker: Option<JoinHandle<()>>,
    end: Option<StreamEnd>,
}

/// Counts bytes read from the file, for progress reporting.
struct CountingReader<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads the first bytes of a file to tell its compression.
///
/// # Errors
/// When the file cannot be opened or read.
pub fn sniff(path: &Path) -> Result<(Compression, Vec<u8>), LoadError> {
    let mut file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    let mut head = vec![0u8; 4096];
    let mut filled = 0;
    while filled < head.len() {
        let n = file
            .read(&mut head[filled..])
            .map_err(|e| LoadError::io(path, e))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    head.truncate(filled);
    let compression = if head.starts_with(&GZIP_MAGIC) {
        Compression::Gzip
    } else if head.starts_with(&ZSTD_MAGIC) {
        Compression::Zstd
    } else {
        Compression::Plain
    };
    Ok((compression, head))
}

impl TextStream {
    /// Opens `path` and starts decompressing it in the background.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let (compression, _) = sniff(path)?;
        let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
        let file_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        let compressed_read = Arc::new(AtomicU64::new(0));
        let counting = CountingReader {
            inner: file,
            count: Arc::clone(&compressed_read),
        };
        let reader = decoder(path, compression, counting)?;
        let (tx, rx) = sync_channel::<Chunk>(BLOCKS_IN_FLIGHT);
        let (recycle, recycled) = sync_channel::<Vec<u8>>(BLOCKS_IN_FLIGHT + 1);
        let worker = std::thread::Builder::new()
            .name("allocview-inflate".into())
            .spawn(move || inflate_loop(reader, &tx, &recycled))
            .map_err(|e| LoadError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            compression,
            file_bytes,
            compressed_read,
            rx: Some(rx),
            recycle,
            worker: Some(worker),
            end: None,
        })
    }

    /// The file's compression.
    #[must_use]
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Size of the file on disk.
    #[must_use]
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// A handle that reports how many bytes of the file have been read so far.
    #[must_use]
    pub fn progress_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.compressed_read)
    }

    /// The next block of text, or `None` at the end of the stream (then see [`Self::end`]).
    ///
    /// # Errors
    /// When reading fails for a reason other than a truncated compressed stream.
    pub fn next_block(&mut self) -> Result<Option<Vec<u8>>, LoadError> {
        if self.end.is_some() {
            return Ok(None);
        }
        let Some(rx) = self.rx.as_ref() else {
            return Ok(None);
        };
        match rx.recv() {
            Ok(Chunk::Data(block)) => Ok(Some(block)),
            Ok(Chunk::End(end)) => {
                self.end = Some(end);
                Ok(None)
            }
            Ok(Chunk::Failed(e)) => Err(LoadError::io(&self.path, e)),
            Err(_) => Err(LoadError::io(
                &self.path,
                io::Error::other("the decompression thread stopped unexpectedly"),
            )),
        }
    }

    /// Gives a parsed block back for reuse.
    pub fn recycle(&self, block: Vec<u8>) {
        // A full recycle queue only means the worker has enough buffers already.
        self.recycle.try_send(block).ok();
    }

    /// How the stream ended, once [`Self::next_block`] has returned `None`.
    #[must_use]
    pub fn end(&self) -> Option<&StreamEnd> {
        self.end.as_ref()
    }
}

impl Drop for TextStream {
    fn drop(&mut self) {
        // Dropping the receiver makes the worker's next send fail, so it stops even when the
        // parser gave up half-way (a parse error).
        drop(self.rx.take());
        if let Some(worker) = self.worker.take() {
            worker.join().ok();
        }
    }
}

fn inflate_loop(
    mut reader: Box<dyn Read + Send>,
    tx: &SyncSender<Chunk>,
    recycled: &Receiver<Vec<u8>>,
) {
    loop {
        let mut block = recycled
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(BLOCK_BYTES));
        block.clear();
        block.resize(BLOCK_BYTES, 0);
        let mut filled = 0;
        let mut end = None;
        while filled < BLOCK_BYTES {
            match reader.read(&mut block[filled..]) {
                Ok(0) => {
                    end = Some(StreamEnd::Complete);
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    end = Some(StreamEnd::Truncated(e.to_string()));
                    break;
                }
                Err(e) => {
                    block.truncate(filled);
                    if filled > 0 && tx.send(Chunk::Data(block)).is_err() {
                        return;
                    }
                    tx.send(Chunk::Failed(e)).ok();
                    return;
                }
            }
        }
        block.truncate(filled);
        if filled > 0 && tx.send(Chunk::Data(block)).is_err() {
            return;
        }
        if let Some(end) = end {
            tx.send(Chunk::End(end)).ok();
            return;
        }
    }
}

/// Reads a whole (possibly gzipped) file into memory as text bytes. For small inputs (logs,
/// plans) where streaming buys nothing.
///
/// # Errors
/// When the file cannot be read; a truncated gzip stream yields what was there plus the
/// [`StreamEnd::Truncated`] marker.
pub fn read_all(path: &Path) -> Result<(Vec<u8>, StreamEnd), LoadError> {
    let mut stream = TextStream::open(path)?;
    let mut out = Vec::new();
    while let Some(block) = stream.next_block()? {
        out.extend_from_slice(&block);
        stream.recycle(block);
    }
    let end = stream.end().cloned().unwrap_or(StreamEnd::Complete);
    Ok((out, end))
}

/// A buffered reader over the decompressed text, for line-oriented formats of modest size.
///
/// # Errors
/// When the file cannot be opened.
pub fn open_text(path: &Path) -> Result<Box<dyn BufRead + Send>, LoadError> {
    let (compression, _) = sniff(path)?;
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    Ok(Box::new(BufReader::new(decoder(path, compression, file)?)))
}

/// The decompressed bytes of `file`, stored with `compression`.
fn decoder<R: Read + Send + 'static>(
    path: &Path,
    compression: Compression,
    file: R,
) -> Result<Box<dyn Read + Send>, LoadError> {
    let buffered = BufReader::with_capacity(256 * 1024, file);
    Ok(match compression {
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(buffered)
                .map_err(|e| LoadError::io(path, e))?,
        ),
        Compression::Plain => Box::new(buffered),
    })
}
