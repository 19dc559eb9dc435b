//! Values by stream number, for a session's streams (its live ones, and their records in the
//! event store): numbers rise and streams mostly come and go in that order.

use std::collections::{BTreeMap, VecDeque};

/// Values by stream number.
///
/// Numbers rise, and a session's streams mostly come and go in that order: the recent ones
/// sit in a window indexed by number, so finding one costs no search. A stream kept long
/// while many came and went after it (the GET stream, a long tool call) would hold the
/// window's front back; once the window is mostly empty slots, such streams move to an
/// ordered map, as does a stream numbered below the window.
pub struct ByNumber<V> {
    /// The number of `window[0]`. Every number in `moved` is below it.
    base: u64,
    window: VecDeque<Option<V>>,
    /// The values in `window`.
    in_window: usize,
    moved: BTreeMap<u64, V>,
}

impl<V> Default for ByNumber<V> {
    fn default() -> Self {
        ByNumber {
            base: 0,
            window: VecDeque::new(),
            in_window: 0,
            moved: BTreeMap::new(),
        }
    }
}

impl<V> ByNumber<V> {
    fn slot(&self, n: u64) -> Option<usize> {
        n.checked_sub(self.base)
            .map(|i| i as usize)
            .filter(|i| *i < self.window.len())
    }

    pub fn get(&self, n: u64) -> Option<&V> {
        match self.slot(n) {
            Some(i) => self.window[i].as_ref(),
            None => self.moved.get(&n),
        }
    }

    pub fn get_mut(&mut self, n: u64) -> Option<&mut V> {
        match self.slot(n) {
            Some(i) => self.window[i].as_mut(),
            None => self.moved.get_mut(&n),
        }
    }

    pub fn get_or_insert(&mut self, n: u64, value: V) -> &mut V {
        // Every number in the map is below the window.
        if self.window.is_empty() && self.moved.last_key_value().is_none_or(|(m, _)| *m < n) {
            self.base = n;
        }
        if let Some(i) = self.slot(n) {
            let slot = &mut self.window[i];
            if slot.is_none() {
                self.in_window += 1;
            }
            return slot.get_or_insert(value);
        }
        if n < self.base {
            return self.moved.entry(n).or_insert(value);
        }
        let gap = (n - self.base) as usize - self.window.len();
        if gap > self.window.len() + 64 {
            // Far ahead of the window: what it holds moves out, and the window starts here.
            self.move_out(self.window.len());
            self.base = n;
        } else {
            self.window
                .extend(std::iter::repeat_with(|| None).take(gap));
        }
        self.window.push_back(Some(value));
        self.in_window += 1;
        self.keep_dense();
        self.window
            .back_mut()
            .and_then(Option::as_mut)
            .expect("just pushed")
    }

    pub fn remove(&mut self, n: u64) -> Option<V> {
        let Some(i) = self.slot(n) else {
            return self.moved.remove(&n);
        };
        let value = self.window[i].take()?;
        self.in_window -= 1;
        self.drop_empty_front();
        self.keep_dense();
        if self.window.is_empty() && self.window.capacity() > 64 {
            self.window = VecDeque::new();
        }
        Some(value)
    }

    /// Keeps the window at most half empty slots (and 64 more): a few long-kept streams that
    /// hold its front back move to the map. The newest slot never moves.
    fn keep_dense(&mut self) {
        while self.window.len() > 2 * self.in_window + 64 {
            let n = self.window.len() - 2 * self.in_window;
            self.move_out(n);
        }
    }

    /// Moves the first `n` slots' values to the map, then drops empty slots at the front.
    fn move_out(&mut self, n: usize) {
        for _ in 0..n {
            if let Some(Some(value)) = self.window.pop_front() {
                self.moved.insert(self.base, value);
                self.in_window -= 1;
            }
            self.base += 1;
        }
        self.drop_empty_front();
    }

    fn drop_empty_front(&mut self) {
        while self.window.front().is_some_and(Option::is_none) {
            self.window.pop_front();
            self.base += 1;
        }
    }

    /// The numbers that hold a value, in no particular order.
    pub fn numbers(&self) -> impl Iterator<Item = u64> + '_ {
        let base = self.base;
        (base..)
            .zip(&self.window)
            .filter_map(|(n, v)| v.as_ref().map(|_| n))
            .chain(self.moved.keys().copied())
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.window.iter().flatten().chain(self.moved.values())
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.window
            .iter_mut()
            .flatten()
            .chain(self.moved.values_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Values found by number agree with a plain map, whatever the order streams
        /// come and go in: mostly rising (the window), now and then far ahead, or below it.
        #[test]
        fn agrees_with_a_map(
            ops in proptest::collection::vec((0u8..10, 0u64..200), 0..600),
        ) {
                        let mut streams = ByNumber::default();
            let mut model = BTreeMap::new();
            let mut next = 0u64;
            for (op, x) in ops {
                match op {
                    0..=3 => {
                        next += x % 3;
                        streams.get_or_insert(next, next);
                        model.entry(next).or_insert(next);
                        next += 1;
                    }
                    4 => {
                        let n = if x % 10 == 0 { next + 1000 + 10 * x } else { x % (next + 1) };
                        streams.get_or_insert(n, n);
                        model.entry(n).or_insert(n);
                        next = next.max(n + 1);
                    }
                    _ => {
                        let keys: Vec<u64> = model.keys().copied().collect();
                        if let Some(n) = keys.get(x as usize % keys.len().max(1)).copied() {
                            let got = streams.remove(n);
                            proptest::prop_assert_eq!(got, model.remove(&n));
                        }
                        proptest::prop_assert_eq!(streams.remove(next + 7).is_some(), false);
                    }
                }
                proptest::prop_assert_eq!(
                    streams.in_window,
                    streams.window.iter().flatten().count()
                );
                proptest::prop_assert!(
                    streams.window.len() <= 2 * streams.in_window + 64,
                    "the window is {} slots for {} streams",
                    streams.window.len(),
                    streams.in_window
                );
            }
            let near = model.keys().flat_map(|n| [n.saturating_sub(1), *n, n + 1]);
            for n in (0..next.min(1000) + 2).chain(near) {
                proptest::prop_assert_eq!(streams.get(n).copied(), model.get(&n).copied());
            }
            let mut all: Vec<u64> = streams.values_mut().map(|v| *v).collect();
            all.sort();
            proptest::prop_assert_eq!(&all, &model.keys().copied().collect::<Vec<_>>());
            let mut numbers: Vec<u64> = streams.numbers().collect();
            numbers.sort();
            proptest::prop_assert_eq!(numbers, all);
        }
    }
}
