//! Loading and unloading: the module's entry points, its arguments,
//! registration of commands (with ACL categories, docs and key specs where
//! the server supports them) and of the INFO section, and Redis's
//! allocator for every allocation of the module.

use super::api::{log_warning, Api, ERR, OK};
use super::call;
use super::context::{Ctx, RawHandler};
use super::info::{self, Info};
use super::string::{string_bytes, Interned};
use super::watch::{self, Memory};
use redis_module::raw::{self, RedisModuleCommand, RedisModuleCtx, RedisModuleString};
use std::ffi::CStr;
use std::mem::{size_of, zeroed};
use std::os::raw::{c_char, c_int};
use std::ptr::{self, NonNull};

/// Every allocation of the module goes to Redis's allocator, so Redis
/// accounts for it (`used_memory`, `maxmemory`).
#[global_allocator]
static ALLOCATOR: redis_module::alloc::RedisAlloc = redis_module::alloc::RedisAlloc;

/// Defines the module's entry point, `RedisModule_OnLoad`, for the module
/// `name` (a `&CStr`) at `version` (MODULE LIST's number), which runs
/// `init(&Load) -> Result<(), String>`; an `Err` is logged and refuses the
/// load. `RedisModule_OnUnload` runs `unload(&Ctx)`.
macro_rules! module {
    (name: $name:expr, version: $version:expr, init: $init:path, unload: $unload:path $(,)?) => {
        /// # Safety
        /// Only Redis calls this, as it loads the module.
        #[no_mangle]
        #[allow(non_snake_case, unsafe_code)]
        pub unsafe extern "C" fn RedisModule_OnLoad(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            // SAFETY: Redis calls OnLoad once per load, with its live
            // context and `argc` argument strings.
            unsafe { $crate::ffi::load::on_load(ctx, argv, argc, $name, $version, $init) }
        }

        /// # Safety
        /// Only Redis calls this, as it unloads the module (MODULE UNLOAD,
        /// or Valkey's shutdown).
        #[no_mangle]
        #[allow(non_snake_case, unsafe_code)]
        pub unsafe extern "C" fn RedisModule_OnUnload(
            ctx: *mut redis_module::raw::RedisModuleCtx,
        ) -> std::os::raw::c_int {
            // SAFETY: Redis calls OnUnload with its live context, on its
            // main thread, with no command of the module running.
            unsafe { $crate::ffi::load::on_unload(ctx, $unload) }
        }
    };
}
pub(crate) use module;

/// What `RedisModule_OnLoad` does: initialise the module API (before which
/// nothing may allocate), resolve the function table, then run `init`.
///
/// # Safety
/// `ctx` must be OnLoad's live context and `argv` point to `argc` strings
/// valid until it returns.
pub unsafe fn on_load(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    name: &'static CStr,
    version: c_int,
    init: fn(&Load) -> Result<(), String>,
) -> c_int {
    // SAFETY: the module API init, first and once, with OnLoad's context
    // and a static NUL-terminated name.
    let status = unsafe {
        raw::Export_RedisModule_Init(
            ctx,
            name.as_ptr(),
            version,
            raw::REDISMODULE_APIVER_1 as c_int,
        )
    };
    if status == ERR {
        return ERR;
    }
    let api = match Api::resolve() {
        Ok(api) => api,
        Err(missing) => {
            log_warning(&format!("tb: this server lacks {missing}; not loading"));
            return ERR;
        }
    };
    let len = usize::try_from(argc).unwrap_or(0);
    let argv: &[*mut RedisModuleString] = if argv.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise about argv and argc.
        unsafe { std::slice::from_raw_parts(argv, len) }
    };
    let load = Load {
        raw: ctx,
        api,
        args: argv.iter().map(|&s| string_bytes(api, s)).collect(),
    };
    match init(&load) {
        Ok(()) => OK,
        Err(e) => {
            log_warning(&format!("tb: {e}"));
            ERR
        }
    }
}

/// What `RedisModule_OnUnload` does: hands `unload` a context to give
/// back what the module keeps between calls, and lets the unload go on.
///
/// # Safety
/// `ctx` must be OnUnload's live context.
pub unsafe fn on_unload(ctx: *mut RedisModuleCtx, unload: fn(&Ctx)) -> c_int {
    watch::stop(ctx);
    // SAFETY: the caller's promise; no arguments.
    if let Some((ctx, _)) = unsafe { Ctx::from_raw(ctx, ptr::null_mut(), 0, c"") } {
        unload(&ctx);
    }
    OK
}

/// A command's docs, as `COMMAND DOCS` shows them, and its key spec.
pub struct Docs {
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub since: &'static CStr,
    /// Where the keys are (`ArgKind::Key(i)` names spec `i`).
    pub key_specs: &'static [KeySpec],
    pub args: &'static [ArgDoc],
}

/// A key spec: where a run of keys begins, and which arguments from there
/// are keys.
pub struct KeySpec {
    /// Read-only keys (TB.PEEK, TB.INFLIGHT); else read and updated.
    pub read_only: bool,
    /// The spec may miss keys: Redis asks the handler instead.
    pub incomplete: bool,
    pub begin: Begin,
    pub find: Find,
}

/// Which arguments from a key spec's beginning are keys.
pub enum Find {
    /// The last key (-1: the last argument) and the step between keys, as
    /// `COMMAND` shows a range.
    Range { last_key: c_int, key_step: c_int },
    /// The argument `count_at` from the beginning counts the keys, which
    /// start `first_key` from the beginning, `key_step` apart (EVAL's
    /// `numkeys`).
    Counted {
        count_at: c_int,
        first_key: c_int,
        key_step: c_int,
    },
}

/// Where a key spec's keys begin.
pub enum Begin {
    /// At this argument.
    Index(c_int),
    /// Just after the first `keyword` at or after argument `from`.
    Keyword(&'static CStr, c_int),
}

/// One argument in the docs (redis-cli shows them as hints).
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: ArgKind,
    /// The keyword that starts it (`BUCKET`).
    pub token: Option<&'static CStr>,
    pub optional: bool,
    /// Repeats (the groups of TB.MCONSUME).
    pub multiple: bool,
    pub subargs: &'static [ArgDoc],
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A key, of this key spec.
    Key(c_int),
    String,
    Double,
    Integer,
    Block,
    /// One of its subarguments (TB.CHARGE's BUCKET or QUOTA clause).
    OneOf,
}

/// A command as `CreateCommand` takes it.
pub struct CommandDef {
    pub name: &'static CStr,
    pub handler: RawHandler,
    pub flags: &'static CStr,
    /// (first, last, step), for servers without key specs.
    pub keys: (c_int, c_int, c_int),
    /// ACL categories, set where the server supports them (>= 7.2).
    pub acl: &'static CStr,
    pub docs: Docs,
    /// redis-cell's command (CL.THROTTLE): registered unless the load
    /// argument `cl-throttle off` says not to, or redis-cell has it.
    pub redis_cell: bool,
}

/// The module being loaded: `OnLoad`'s context and arguments.
pub struct Load<'a> {
    raw: *mut RedisModuleCtx,
    api: &'static Api,
    args: Vec<&'a [u8]>,
}

impl Load<'_> {
    /// The arguments after the module's path (`loadmodule path a b`).
    pub fn args(&self) -> &[&[u8]] {
        &self.args
    }

    /// Whether the server has `command` under that name.
    pub fn has_command(&self, command: &CStr) -> bool {
        call::command_exists(self.raw, self.api, command)
    }

    /// Writers open keys once, for writing, and signal a key as modified
    /// only when they change it (`Ctx::signal_modified`).
    pub fn no_implicit_signal_modified(&self) {
        // SAFETY: a function pointer read at load.
        let Some(set) = (unsafe { raw::RedisModule_SetModuleOptions }) else {
            return;
        };
        let option = raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int;
        // SAFETY: OnLoad's context.
        unsafe { set(self.raw, option) };
    }

    /// A string for the life of the process.
    pub fn intern(&self, text: &str) -> Option<Interned> {
        // SAFETY: a NULL context makes a string that is not freed when a
        // command returns; CreateString copies the bytes.
        let s =
            unsafe { (self.api.create_string)(ptr::null_mut(), text.as_ptr().cast(), text.len()) };
        NonNull::new(s).map(Interned)
    }

    /// Runs `watcher` with the memory settings now, and again whenever
    /// they may have changed.
    pub fn watch_memory(&self, watcher: fn(&Memory)) {
        watch::watch(self.raw, self.api, watcher);
    }

    /// Makes `section` the module's INFO section writer.
    pub fn register_info(&self, section: fn(&mut Info)) -> Result<(), String> {
        info::set_section(section);
        // SAFETY: a function pointer read at load.
        let Some(register) = (unsafe { raw::RedisModule_RegisterInfoFunc }) else {
            return Err("this server lacks RedisModule_RegisterInfoFunc".into());
        };
        // SAFETY: OnLoad's context and a function that lives forever.
        if unsafe { register(self.raw, Some(info::write_section)) } != OK {
            return Err("could not register the INFO section".into());
        }
        Ok(())
    }

    /// Registers `cmd`; where the server has the APIs (detected now: 7.0
    /// has no ACL category API, 6.2 neither, nor SetCommandInfo) also its
    /// ACL categories, docs and key specs. Only a failed registration is an
    /// error; a refused extra is logged, and a command whose key specs could
    /// not be set keeps the stricter full-access one.
    pub fn register(&self, cmd: &CommandDef) -> Result<(), String> {
        let (first, last, step) = cmd.keys;
        // SAFETY: a function pointer read at load.
        let Some(create) = (unsafe { raw::RedisModule_CreateCommand }) else {
            return Err("this server lacks RedisModule_CreateCommand".into());
        };
        // SAFETY: OnLoad's context, NUL-terminated name and flags, and a
        // handler made by `handler!`.
        let created = unsafe {
            create(
                self.raw,
                cmd.name.as_ptr(),
                cmd.handler,
                cmd.flags.as_ptr(),
                first,
                last,
                step,
            )
        };
        if created != OK {
            return Err(format!("could not register {:?}", cmd.name));
        }
        // SAFETY: a function pointer read at load.
        let Some(get) = (unsafe { raw::RedisModule_GetCommand }) else {
            return Ok(());
        };
        // SAFETY: OnLoad's context and a command this module just made.
        let command = unsafe { get(self.raw, cmd.name.as_ptr()) };
        if command.is_null() {
            return Ok(());
        }
        // SAFETY: a function pointer read at load.
        if let Some(set) = unsafe { raw::RedisModule_SetCommandACLCategories } {
            // SAFETY: a command of this module, NUL-terminated categories.
            if unsafe { set(command, cmd.acl.as_ptr()) } != OK {
                log_warning(&format!(
                    "tb: could not set ACL categories of {:?}",
                    cmd.name
                ));
            }
        }
        if !set_command_info(command, &cmd.docs) {
            log_warning(&format!(
                "tb: could not set the key specs and docs of {:?}",
                cmd.name
            ));
        }
        Ok(())
    }
}

/// The arguments of `args` as a zero-terminated C array; nested blocks are
/// kept alive in `keep` until the server has copied them.
fn c_args(
    args: &[ArgDoc],
    keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            // SAFETY: all zeros is the documented "unset" of every field.
            let mut c: raw::RedisModuleCommandArg = unsafe { zeroed() };
            c.name = a.name.as_ptr();
            c.type_ = match a.kind {
                ArgKind::Key(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                ArgKind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                ArgKind::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
                ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                ArgKind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                ArgKind::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
            };
            c.key_spec_index = match a.kind {
                ArgKind::Key(spec) => spec,
                _ => -1,
            };
            if let Some(token) = a.token {
                c.token = token.as_ptr();
            }
            let mut flags = 0;
            if a.optional {
                flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
            }
            if a.multiple {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
            }
            c.flags = flags as c_int;
            if !a.subargs.is_empty() {
                c.subargs = c_args(a.subargs, keep);
            }
            c
        })
        .collect();
    // SAFETY: the zeroed element terminates the array.
    out.push(unsafe { zeroed() });
    let p = out.as_mut_ptr();
    keep.push(out);
    p
}

/// `SetCommandInfo`: false if the server refused; true also where it lacks
/// the API (Redis 6.2, which has no key specs).
fn set_command_info(command: *mut RedisModuleCommand, docs: &Docs) -> bool {
    // SAFETY: a function pointer read at load.
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return true;
    };
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };
    let mut specs: Vec<raw::RedisModuleCommandKeySpec> = Vec::new();
    for ks in docs.key_specs {
        let access = if ks.read_only {
            raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS
        } else {
            raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_ACCESS
                | raw::REDISMODULE_CMD_KEY_UPDATE
        };
        // SAFETY: zeroed key specs are the unset fields.
        let mut spec: raw::RedisModuleCommandKeySpec = unsafe { zeroed() };
        let incomplete = if ks.incomplete {
            raw::REDISMODULE_CMD_KEY_INCOMPLETE
        } else {
            0
        };
        spec.flags = u64::from(access | incomplete);
        match ks.begin {
            Begin::Index(pos) => {
                spec.begin_search_type =
                    raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
                spec.bs.index.pos = pos;
            }
            Begin::Keyword(keyword, from) => {
                spec.begin_search_type =
                    raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_KEYWORD;
                spec.bs.keyword.keyword = keyword.as_ptr();
                spec.bs.keyword.startfrom = from;
            }
        }
        match ks.find {
            Find::Range { last_key, key_step } => {
                spec.find_keys_type =
                    raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
                spec.fk.range.lastkey = last_key;
                spec.fk.range.keystep = key_step;
                spec.fk.range.limit = 0;
            }
            Find::Counted {
                count_at,
                first_key,
                key_step,
            } => {
                spec.find_keys_type =
                    raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
                spec.fk.keynum.keynumidx = count_at;
                spec.fk.keynum.firstkey = first_key;
                spec.fk.keynum.keystep = key_step;
            }
        }
        specs.push(spec);
    }
    // SAFETY: the zeroed spec terminates the array.
    specs.push(unsafe { zeroed() });
    let mut keep = Vec::new();
    let args = c_args(docs.args, &mut keep);
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: docs.summary.as_ptr(),
        complexity: docs.complexity.as_ptr(),
        since: docs.since.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null::<c_char>(),
        // 0: the handlers check the argument count themselves, so their
        // error replies (and `tb_errors`) stay as they are.
        arity: 0,
        key_specs: specs.as_mut_ptr(),
        args,
    };
    // SAFETY: `info` and all it points to live until the call returns, and
    // the server copies what it keeps.
    unsafe { set_info(command, &info) == OK }
}
