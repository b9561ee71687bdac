//! What a caught panic says: the backend threads and the HTTP thread both log it.

use std::any::Any;

/// The message a panic was raised with (`panic!("...")` or a formatted one), if any.
pub fn panic_message(payload: &(dyn Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_and_formatted_messages_are_read_others_are_not() {
        let literal = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(literal.as_ref()), Some("plain"));
        let formatted = std::panic::catch_unwind(|| panic!("{} {}", "with", 2)).unwrap_err();
        assert_eq!(panic_message(formatted.as_ref()), Some("with 2"));
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), None);
    }
}
