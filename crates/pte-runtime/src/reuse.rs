//! State that the prepared calls of one method share. What a kernel or a delegate
//! derives from constant bytes alone (a weight packed for the product kernel) is made
//! once for every call that reads the same bytes: an unrolled recurrent network reads
//! one weight at each of its steps, and a copy per step would multiply the method's
//! memory and push the weight out of the caches between steps.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// What one state is made from: the bytes (by address and length), the kind of state,
/// and the maker's variant of it (such as the matrix dimensions the bytes are read
/// with).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    address: usize,
    len: usize,
    kind: &'static str,
    variant: u64,
}

/// The states made from constants while one method loads (see the module docs).
///
/// Bytes are known by their address, so only bytes that neither move nor change while
/// the method loads may be asked about: the program's and its data files' constants,
/// and constants computed at load.
#[derive(Default)]
pub struct DerivedStates {
    made: Mutex<HashMap<Key, Arc<dyn Any + Send + Sync>>>,
}

impl DerivedStates {
    /// The state of `kind` and `variant` made from `bytes`: the one made before, or
    /// `make`'s (kept for the next call). `variant` must hold whatever else the state
    /// depends on.
    pub fn get_or_make<T: Any + Send + Sync, E>(
        &self,
        bytes: &[u8],
        kind: &'static str,
        variant: u64,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        let key = Key {
            address: bytes.as_ptr() as usize,
            len: bytes.len(),
            kind,
            variant,
        };
        // A poisoned lock only means another preparation failed; its entries are whole.
        let found = self
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(Ok(state)) = found.map(|s| s.downcast::<T>()) {
            return Ok(state);
        }
        let state = Arc::new(make()?);
        self.made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, state.clone() as Arc<dyn Any + Send + Sync>);
        Ok(state)
    }
}
