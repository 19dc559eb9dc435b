//! [`Object`]: a value read from a JSON object only.

use serde::Deserialize;

/// `T` read from a JSON object only. serde reads a struct from an array too, by position:
/// `["2026-07-28"]` would pass for a struct whose first field is a version. Wrapped in
/// `Object`, anything but an object is refused.
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
            .map(Object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Named {
        name: Option<String>,
    }

    #[test]
    fn only_an_object_is_read() {
        let Object(n) = serde_json::from_str::<Object<Named>>(r#"{"name":"x"}"#).unwrap();
        assert_eq!(n.name.as_deref(), Some("x"));
        assert!(
            serde_json::from_str::<Named>(r#"["x"]"#).is_ok(),
            "what Object is for"
        );
        assert!(serde_json::from_str::<Object<Named>>(r#"["x"]"#).is_err());
        assert!(serde_json::from_str::<Object<Named>>("null").is_err());
    }
}
