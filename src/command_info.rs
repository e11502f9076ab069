//! `RedisModule_SetCommandInfo`: a command's docs and key specs, built as
//! the C structures the server copies.

use crate::registry::{Arg, ArgKind, Docs};
use redis_module::raw::{self, RedisModuleCommand};
use std::mem::{size_of, zeroed};
use std::os::raw::{c_char, c_int};
use std::ptr;

/// The arguments of `args` as a zero-terminated C array; nested blocks
/// are kept alive in `keep` until the server has copied them.
fn c_args(
    args: &[Arg],
    keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            // SAFETY: all-zero is the documented "unset" value of every field.
            let mut c: raw::RedisModuleCommandArg = unsafe { zeroed() };
            c.name = a.name.as_ptr();
            c.type_ = match a.kind {
                ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                ArgKind::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
                ArgKind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            };
            // Every command has one key spec; other arguments name none.
            c.key_spec_index = if matches!(a.kind, ArgKind::Key) {
                0
            } else {
                -1
            };
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

/// Sets `docs` on `command`. False if the server refused them; true also
/// where the server lacks the API (Redis 6.2), which has no key specs.
pub fn set(command: *mut RedisModuleCommand, docs: &Docs) -> bool {
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return true;
    };
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };
    let access = if docs.read_only {
        raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS
    } else {
        raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_UPDATE
    };
    let has_keys = docs
        .args
        .iter()
        .any(|a| matches!(a.kind, ArgKind::Key) || !a.subargs.is_empty());
    // SAFETY: zeroed key specs are the terminator and the unset fields.
    let mut specs: Vec<raw::RedisModuleCommandKeySpec> = Vec::new();
    if has_keys {
        let mut spec: raw::RedisModuleCommandKeySpec = unsafe { zeroed() };
        spec.flags = u64::from(access);
        spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        spec.bs.index.pos = 1;
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        spec.fk.range.lastkey = docs.key_range.0;
        spec.fk.range.keystep = docs.key_range.1;
        spec.fk.range.limit = 0;
        specs.push(spec);
    }
    specs.push(unsafe { zeroed() });
    let mut keep = Vec::new();
    let args = c_args(docs.args, &mut keep);
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: docs.summary.as_ptr(),
        complexity: docs.complexity.as_ptr(),
        since: crate::registry::SINCE.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null::<c_char>(),
        // 0: the handlers check the argument count themselves, so their
        // error replies (and `tb_errors`) stay as they are.
        arity: 0,
        key_specs: specs.as_mut_ptr(),
        args,
    };
    // SAFETY: `info` and everything it points to live until the call
    // returns, and the server copies what it keeps.
    unsafe { set_info(command, &info) == raw::REDISMODULE_OK as c_int }
}
