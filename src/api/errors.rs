//! The error vocabulary every dialect maps its own onto. Each API names failures differently
//! (Anthropic `overloaded_error` at 529, OpenAI `server_error` / `overloaded` at 503), but they
//! mean the same few things; [`ErrorClass`] is that meaning. A dialect's [`ErrorTable`] is its
//! one type↔status table: it answers both "which status does this error type stand for" (an
//! error event read before the commit point becomes a response with that status) and "which
//! type does this status carry" (a body-less upstream error, the mock's defaults), and it
//! renders legate's own errors. Translation goes through the classes, so two dialects agree
//! by construction.

use http::StatusCode;

/// What an error means, independent of any API's names for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    InvalidRequest,
    Authentication,
    Billing,
    Permission,
    NotFound,
    Conflict,
    TooLarge,
    RateLimited,
    /// An internal error of the provider (or of legate).
    Server,
    Timeout,
    Overloaded,
}

/// One row of a dialect's table: the class, the API's `type` (and `code`, where the API has
/// one) for it, its canonical status, and other statuses that carry the same type.
#[derive(Debug, Clone, Copy)]
pub struct ErrorRow {
    pub class: ErrorClass,
    pub error_type: &'static str,
    pub code: Option<&'static str>,
    pub status: u16,
    pub also: &'static [u16],
}

/// A dialect's error table: rows, plus names an upstream may use that legate reads but never
/// writes (aliases), and the types of statuses no row names.
#[derive(Debug)]
pub struct ErrorTable {
    pub rows: &'static [ErrorRow],
    /// `type` values read as a class (beyond each row's own type).
    pub type_aliases: &'static [(&'static str, ErrorClass)],
    /// `code` values read as a class (beyond each row's own code); codes win over types.
    pub code_aliases: &'static [(&'static str, ErrorClass)],
    /// The class of a 4xx status no row names.
    pub other_4xx: ErrorClass,
    /// The class of any other status no row names.
    pub other: ErrorClass,
}

impl ErrorTable {
    /// The row of a class. Every table has a row for every class (tested per dialect).
    pub fn row(&self, class: ErrorClass) -> &'static ErrorRow {
        self.rows
            .iter()
            .find(|r| r.class == class)
            .unwrap_or(&self.rows[0])
    }

    /// The class an error `type` / `code` names: a known code first, then a known type.
    pub fn class_of(&self, error_type: Option<&str>, code: Option<&str>) -> Option<ErrorClass> {
        let by_code = code.and_then(|c| {
            self.rows
                .iter()
                .find(|r| r.code == Some(c))
                .map(|r| r.class)
                .or_else(|| lookup(self.code_aliases, c))
        });
        by_code.or_else(|| {
            let t = error_type?;
            self.rows
                .iter()
                .find(|r| r.error_type == t && r.code.is_none())
                .or_else(|| self.rows.iter().find(|r| r.error_type == t))
                .map(|r| r.class)
                .or_else(|| lookup(self.type_aliases, t))
        })
    }

    /// The class a status stands for.
    pub fn class_for_status(&self, status: u16) -> ErrorClass {
        self.rows
            .iter()
            .find(|r| r.status == status)
            .or_else(|| self.rows.iter().find(|r| r.also.contains(&status)))
            .map_or(
                if (400..500).contains(&status) {
                    self.other_4xx
                } else {
                    self.other
                },
                |r| r.class,
            )
    }

    /// The status an error of this type / code stands for; unknown ones are a server error.
    pub fn status_of(&self, error_type: Option<&str>, code: Option<&str>) -> StatusCode {
        let class = self
            .class_of(error_type, code)
            .unwrap_or(ErrorClass::Server);
        StatusCode::from_u16(self.row(class).status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The `type` a status carries.
    pub fn type_for_status(&self, status: u16) -> &'static str {
        self.row(self.class_for_status(status)).error_type
    }
}

fn lookup(aliases: &[(&str, ErrorClass)], name: &str) -> Option<ErrorClass> {
    aliases.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// An error as legate writes it itself: what it means, a machine-readable code (OpenAI's
/// `code`; Anthropic has none), and a message fit for the caller.
#[derive(Debug, Clone, Copy)]
pub struct LocalError<'a> {
    pub class: ErrorClass,
    pub code: &'static str,
    pub message: &'a str,
    /// The request field the error is about (OpenAI's `error.param`), where there is one.
    pub param: Option<&'static str>,
}

/// The parts of an error body or error event legate reads (never its message for decisions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorFields {
    pub error_type: Option<String>,
    pub code: Option<String>,
    pub message: Option<String>,
}

/// Every class, for table tests.
#[cfg(test)]
pub(crate) const ALL_CLASSES: [ErrorClass; 11] = [
    ErrorClass::InvalidRequest,
    ErrorClass::Authentication,
    ErrorClass::Billing,
    ErrorClass::Permission,
    ErrorClass::NotFound,
    ErrorClass::Conflict,
    ErrorClass::TooLarge,
    ErrorClass::RateLimited,
    ErrorClass::Server,
    ErrorClass::Timeout,
    ErrorClass::Overloaded,
];
