//! The Responses store: finished responses kept by id (`store: true`, OpenAI's
//! default) for `GET /v1/responses/{id}` and `previous_response_id`, bounded by
//! `--responses-store-size` with least-recently-used eviction. In memory only,
//! as vLLM's: a restart forgets them.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// vLLM-like default: a few thousand conversations of a local server.
pub const DEFAULT_SIZE: usize = 4096;

/// One stored response.
#[derive(Debug)]
pub struct Stored {
    /// The response object, as `GET` returns it.
    pub response: Value,
    /// The conversation up to and including this response's output.
    pub history: Arc<History>,
}

/// A conversation as chat messages (without `instructions`, which a
/// follow-up does not inherit): the turns of `previous_response_id` shared,
/// not copied, so a long chain of stored responses costs its messages once
/// (a follow-up keeps the turns it builds on alive, even once evicted).
#[derive(Debug, Default)]
pub struct History {
    parent: Option<Arc<History>>,
    /// This turn's input and output messages.
    messages: Vec<Value>,
}

impl History {
    pub fn new(parent: Option<Arc<History>>, messages: Vec<Value>) -> Arc<History> {
        Arc::new(History { parent, messages })
    }

    /// Every message, oldest first.
    pub fn messages(&self) -> Vec<Value> {
        let mut chain = vec![self];
        while let Some(p) = chain.last().and_then(|h| h.parent.as_deref()) {
            chain.push(p);
        }
        chain
            .iter()
            .rev()
            .flat_map(|h| h.messages.iter().cloned())
            .collect()
    }
}

impl Drop for History {
    /// Unlinks the chain iteratively: dropping a conversation of many turns
    /// must not recurse once per turn.
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(p) = next {
            next = match Arc::try_unwrap(p) {
                Ok(mut h) => h.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// A bounded LRU map from response id to [`Stored`].
pub struct ResponseStore {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// id -> (last use, entry).
    map: HashMap<String, (u64, Arc<Stored>)>,
    /// last use -> id: the first is the one to evict.
    order: BTreeMap<u64, String>,
    tick: u64,
}

impl Inner {
    fn touch(&mut self, id: &str) -> Option<Arc<Stored>> {
        self.tick += 1;
        let tick = self.tick;
        let (used, entry) = self.map.get_mut(id)?;
        self.order.remove(used);
        *used = tick;
        self.order.insert(tick, id.to_string());
        Some(entry.clone())
    }
}

impl ResponseStore {
    /// A store of at most `cap` responses (0: nothing is stored).
    pub fn new(cap: usize) -> Self {
        ResponseStore {
            cap,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves consistent maps.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry, marked as just used.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().touch(id)
    }

    /// Keeps `entry` under `id`, evicting the least recently used beyond the cap.
    pub fn put(&self, id: String, entry: Stored) {
        if self.cap == 0 {
            return;
        }
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some((old, _)) = g.map.insert(id.clone(), (tick, Arc::new(entry))) {
            g.order.remove(&old);
        }
        g.order.insert(tick, id);
        while g.map.len() > self.cap {
            let Some((_, victim)) = g.order.pop_first() else {
                break;
            };
            g.map.remove(&victim);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn entry(n: u64) -> Stored {
        Stored {
            response: Value::from(n),
            history: Arc::default(),
        }
    }

    /// The obviously-correct LRU: a queue, most recent at the back.
    #[derive(Default)]
    struct Reference(VecDeque<(String, u64)>);

    impl Reference {
        fn get(&mut self, id: &str) -> Option<u64> {
            let i = self.0.iter().position(|(k, _)| k == id)?;
            let e = self.0.remove(i)?;
            let v = e.1;
            self.0.push_back(e);
            Some(v)
        }
        fn put(&mut self, id: &str, v: u64, cap: usize) {
            if cap == 0 {
                return;
            }
            self.0.retain(|(k, _)| k != id);
            self.0.push_back((id.to_string(), v));
            while self.0.len() > cap {
                self.0.pop_front();
            }
        }
    }

    proptest! {
        /// Any sequence of puts and gets sees what the reference LRU sees.
        #[test]
        fn matches_the_reference(cap in 0usize..5, ops in prop::collection::vec((any::<bool>(), 0u8..8), 0..60)) {
            let store = ResponseStore::new(cap);
            let mut reference = Reference::default();
            for (n, (put, key)) in ops.into_iter().enumerate() {
                let id = format!("resp_{key}");
                if put {
                    store.put(id.clone(), entry(n as u64));
                    reference.put(&id, n as u64, cap);
                } else {
                    let got = store.get(&id).map(|e| e.response.as_u64().unwrap());
                    prop_assert_eq!(got, reference.get(&id));
                }
                prop_assert_eq!(store.len(), reference.0.len());
            }
        }
    }

    /// Turns share their history; a chain far longer than the stack unwinds
    /// without recursion.
    #[test]
    fn histories_chain_and_drop_iteratively() {
        let a = History::new(None, vec![Value::from(1), Value::from(2)]);
        let b = History::new(Some(a.clone()), vec![Value::from(3)]);
        assert_eq!(b.messages(), [1, 2, 3].map(Value::from));
        assert_eq!(a.messages().len(), 2);
        let mut h = History::new(None, vec![]);
        for i in 0..200_000 {
            h = History::new(Some(h), vec![Value::from(i)]);
        }
        assert_eq!(h.messages().len(), 200_000);
        drop(h);
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let s = ResponseStore::new(2);
        s.put("a".into(), entry(1));
        s.put("b".into(), entry(2));
        assert!(s.get("a").is_some());
        s.put("c".into(), entry(3));
        assert!(s.get("b").is_none(), "b was the least recently used");
        assert!(s.get("a").is_some() && s.get("c").is_some());
        let off = ResponseStore::new(0);
        off.put("a".into(), entry(1));
        assert!(off.get("a").is_none() && !off.enabled());
    }
}
