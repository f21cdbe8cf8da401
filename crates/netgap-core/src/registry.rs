//! Lookups shared by netgap's registries (transports, tests, workloads,
//! importers): each registry is a static list of entries with unique
//! names, and a new entry is one more line in its list.

/// An entry of a registry, known by its name on the command line and in
/// results.
pub trait Named {
    /// The entry's name; unique within its registry.
    fn name(&self) -> &'static str;
}

/// The entry of `registry` called `name`.
pub fn find<T: ?Sized + Named>(registry: &[&'static T], name: &str) -> Option<&'static T> {
    registry.iter().copied().find(|e| e.name() == name)
}

/// The names of `registry`'s entries, comma separated, for messages that
/// list what is available.
pub fn names<T: ?Sized + Named>(registry: &[&T]) -> String {
    registry
        .iter()
        .map(|e| e.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Entry(&'static str);

    impl Named for Entry {
        fn name(&self) -> &'static str {
            self.0
        }
    }

    static A: Entry = Entry("a");
    static B: Entry = Entry("b");

    #[test]
    fn finds_by_name_and_lists_in_order() {
        let registry: [&'static Entry; 2] = [&A, &B];
        assert_eq!(find(&registry, "b").map(|e| e.0), Some("b"));
        assert!(find(&registry, "c").is_none());
        assert_eq!(names(&registry), "a, b");
    }
}
